"""The API docs page (Swagger UI at /api/v1/docs) with its JavaScript and CSS served by the API itself.

APIFlask's defaults load them from a CDN, which leaves the page blank on a machine without internet access. The
files are Swagger UI 5's dist as the `flask-swagger-ui` package ships it (its folder DIST_PACKAGE/DIST_FOLDER; only
the files, not its blueprint: APIFlask renders the page), served at DOCS_ASSETS_PATH/<file>. Swagger UI renders
OpenAPI 3.1, the version of the API's document, from 5.0 on: 4.x answered "Unable to render this definition".
"""

from __future__ import annotations

from flask import Blueprint, Flask, abort, send_from_directory

DOCS_ASSETS_PATH = "/api/v1/docs/assets"
DIST_PACKAGE = "flask_swagger_ui"
DIST_FOLDER = "dist"
# The files the docs page loads: nothing else of the package's folder is served.
ASSETS = {
    "SWAGGER_UI_CSS": "swagger-ui.css",
    "SWAGGER_UI_BUNDLE_JS": "swagger-ui-bundle.js",
    "SWAGGER_UI_STANDALONE_PRESET_JS": "swagger-ui-standalone-preset.js",
    "DOCS_FAVICON": "favicon-32x32.png",
}


def init_app(app: Flask) -> None:
    """Point APIFlask's docs config at the local copies and serve them (not in the OpenAPI document)."""
    from importlib.resources import files

    dist = files(DIST_PACKAGE) / DIST_FOLDER
    bp = Blueprint("docs_assets", __name__)
    served = frozenset(ASSETS.values())

    @bp.get(f"{DOCS_ASSETS_PATH}/<name>")
    def docs_asset(name: str):
        if name not in served:
            abort(404)
        return send_from_directory(str(dist), name, max_age=86400)

    app.register_blueprint(bp)
    for key, name in ASSETS.items():
        app.config[key] = f"{DOCS_ASSETS_PATH}/{name}"
