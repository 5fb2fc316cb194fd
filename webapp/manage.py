"""Administration of the training service from the `aligner` command line: migrations, API tokens, the catalogue.

    aligner db upgrade [--database-url URL]          # create or update the schema (Alembic, migrations/)
    aligner db downgrade REV [--database-url URL]    # e.g. REV=base drops every table
    aligner token create --user NAME [--name LABEL] [--admin] [--expires DAYS]   # prints a new bearer token
    aligner token list                               # every token: user, role, dates, active/expired/revoked
    aligner token revoke ID                          # the token stops working at once
    aligner models add NAME PATH --kind policy|reward|critic|tokenizer   # a server folder jobs may use
    aligner rewards add NAME module:callable         # a reward function jobs may name (built-ins need nothing)
    aligner servers add NAME URL --kind reward|critic [--model-name M]   # a running server jobs may name
    aligner models|rewards|servers list|remove NAME
    aligner ui --api-url URL [--port N]              # the dashboard (webapp/ui/), a client of the REST API

The URL defaults to `webapp.db.database_url()`: env ALIGNER_DATABASE_URL, else a SQLite file under ALIGNER_DATA_DIR.
Only argparse and aligner.errors are imported at module level, so `aligner train` does not need the service's
packages.
"""

from __future__ import annotations

import argparse

from aligner.errors import AlignerError


def _database_error(err: Exception, url: str | None) -> Exception:
    from sqlalchemy.engine import make_url

    from webapp.db import database_url

    shown = make_url(url or database_url()).render_as_string(hide_password=True)
    reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
    return AlignerError(f"database {shown}: {reason}")


def _cmd_db(args: argparse.Namespace) -> None:
    from sqlalchemy.exc import OperationalError

    from webapp.migrate import downgrade, upgrade

    try:
        if args.db_command == "upgrade":
            upgrade(args.database_url, args.revision)
        else:
            downgrade(args.database_url, args.revision)
    except OperationalError as err:
        raise _database_error(err, args.database_url) from None


def _in_session(args: argparse.Namespace, handler) -> None:
    """Run `handler(session, args)` in one transaction on the service's database and print the lines it returns."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from webapp.db import database_url, make_engine, make_session_factory, session_scope

    engine = make_engine(args.database_url or database_url())
    try:
        with session_scope(make_session_factory(engine)) as session:
            lines = handler(session, args)
    except (OperationalError, ProgrammingError) as err:
        error = _database_error(err, args.database_url)
        if "no such table" in str(error) or "no such column" in str(error) or "does not exist" in str(error):
            error.args = (f"{error}; run `aligner db upgrade` first",)
        raise error from None
    finally:
        engine.dispose()
    print("\n".join(lines))


def _cmd_token(args: argparse.Namespace) -> None:
    _in_session(args, TOKEN_COMMANDS[args.token_command])


def _token_create(session, args: argparse.Namespace) -> list[str]:
    from webapp.db import create_token

    return [create_token(session, args.user, args.name, admin=args.admin, expires_days=args.expires)]


def _token_list(session, args: argparse.Namespace) -> list[str]:
    """One line a token: id, user, role, label, created, expires, last used, and whether it still authenticates."""
    from webapp.db import list_tokens, utcnow

    def day(value) -> str:
        return value.strftime("%Y-%m-%d %H:%M") if value else "-"

    now = utcnow()
    lines = [
        f"{'id':>4}  {'user':<16} {'role':<5} {'label':<16} {'created':<16} {'expires':<16} {'last used':<16} state"
    ]
    for token, user in list_tokens(session):
        if token.revoked_at is not None:
            state = f"revoked {day(token.revoked_at)}"
        elif token.expires_at is not None and token.expires_at <= now:
            state = "expired"
        else:
            state = "active"
        role = "admin" if user.is_admin else "user"
        lines.append(
            f"{token.id:>4}  {user.name:<16} {role:<5} {token.name or '-':<16} {day(token.created_at):<16} "
            f"{day(token.expires_at):<16} {day(token.last_used_at):<16} {state}"
        )
    return lines


def _token_revoke(session, args: argparse.Namespace) -> list[str]:
    from webapp.db import revoke_token

    if not revoke_token(session, args.id):
        raise AlignerError(f"no active token with id {args.id} (see `aligner token list`)")
    return [f"token {args.id} revoked"]


TOKEN_COMMANDS = {"create": _token_create, "list": _token_list, "revoke": _token_revoke}


# ------------------------------------------------------------------------------------------------- catalogue
def _catalogue_add(session, args: argparse.Namespace) -> list[str]:
    from webapp import catalogue

    if args.catalogue == "models":
        entry = catalogue.add_model(session, args.name, args.path, args.kind, args.description)
        size = f"{entry.size_bytes / 1e6:.1f} MB"
        params = f", {entry.num_parameters:,} parameters" if entry.num_parameters is not None else ""
        return [f"model {entry.name} ({entry.kind}): {entry.architecture}{params}, {size}, {entry.path}"]
    if args.catalogue == "rewards":
        entry = catalogue.add_reward_function(session, args.name, args.target, args.description)
        return [f"reward function {entry.name}: {entry.target}"]
    entry = catalogue.add_server(session, args.name, args.url, args.kind, args.model_name, args.description)
    return [f"{entry.kind} server {entry.name}: {entry.url} (model {entry.model_name})"]


def _catalogue_list(session, args: argparse.Namespace) -> list[str]:
    from sqlalchemy import select

    from aligner.rewards.builtins import BUILTIN_REWARDS
    from webapp.catalogue import CATALOGUE_TABLES

    table = CATALOGUE_TABLES[args.catalogue]
    entries = session.scalars(select(table).order_by(table.name)).all()
    if args.catalogue == "models":
        return [f"{'name':<24} {'kind':<9} {'architecture':<28} {'MB':>9}  path"] + [
            f"{e.name:<24} {e.kind:<9} {e.architecture:<28} {e.size_bytes / 1e6:>9.1f}  {e.path}" for e in entries
        ]
    if args.catalogue == "rewards":
        builtins = [f"{name:<24} built-in  {b.target}" for name, b in BUILTIN_REWARDS.items()]
        return builtins + [f"{e.name:<24} {'':<9} {e.target}" for e in entries]
    return [f"{e.name:<24} {e.kind:<7} {e.model_name:<16} {e.url}" for e in entries]


def _catalogue_remove(session, args: argparse.Namespace) -> list[str]:
    from webapp.catalogue import CATALOGUE_TABLES, remove_entry

    if not remove_entry(session, CATALOGUE_TABLES[args.catalogue], args.name):
        raise AlignerError(f"{args.name!r} is not in the catalogue (see `aligner {args.catalogue} list`)")
    return [f"{args.name} removed"]


CATALOGUE_COMMANDS = {"add": _catalogue_add, "list": _catalogue_list, "remove": _catalogue_remove}


def _cmd_catalogue(args: argparse.Namespace) -> None:
    _in_session(args, CATALOGUE_COMMANDS[args.catalogue_command])


def _add_catalogue_commands(sub: argparse._SubParsersAction, url_help: str) -> None:
    """`aligner models|rewards|servers add|list|remove`: what jobs submitted over the API may use."""
    from webapp.db import MODEL_KINDS, SERVER_KINDS

    helps = {
        "models": "the catalogue's models: server folders jobs may use as policy, reward model, critic, tokenizer",
        "rewards": "the catalogue's reward functions (module:callable) jobs may name; built-ins are always there",
        "servers": "the catalogue's reward and critic servers jobs may name",
    }
    for catalogue, help_text in helps.items():
        parser = sub.add_parser(catalogue, help=help_text)
        commands = parser.add_subparsers(dest="catalogue_command", required=True)
        add = commands.add_parser("add", help="register an entry")
        add.add_argument("name", help="the name jobs use (letters, digits, '.', '_', '-')")
        if catalogue == "models":
            add.add_argument("path", help="a Hugging Face folder on this server")
            add.add_argument("--kind", required=True, choices=MODEL_KINDS, help="what jobs may use it as")
        elif catalogue == "rewards":
            add.add_argument("target", help="package.module:function, importable by the workers")
        else:
            add.add_argument("url", help="the server's http(s) URL, as the workers reach it")
            add.add_argument("--kind", required=True, choices=SERVER_KINDS)
            add.add_argument("--model-name", default="reward_model", help="model name on a reward server")
        add.add_argument("--description", default="", help="what it is, shown to users")
        listing = commands.add_parser("list", help="list the entries")
        remove = commands.add_parser("remove", help="remove an entry (files are left alone)")
        remove.add_argument("name")
        for command in (add, listing, remove):
            command.add_argument("--database-url", help=url_help)
        parser.set_defaults(func=_cmd_catalogue, catalogue=catalogue)


def _positive_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not 0 < days < 100_000:
        raise argparse.ArgumentTypeError(f"must be more than 0 and under 100000 days, got {text}")
    return days


def _cmd_up(args: argparse.Namespace) -> None:
    from webapp.stack import run

    run(args)


def _cmd_ui(args: argparse.Namespace) -> None:
    from webapp.settings import service_settings
    from webapp.ui import run

    # The environment is read here, not when the parser is built: every `aligner` command builds it.
    settings = service_settings()
    args.api_url = settings.api_url if args.api_url is None else args.api_url
    args.data_dir = str(settings.data_dir) if args.data_dir is None else args.data_dir
    run(args)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the service's commands (db, token, models, rewards, servers, up, ui) on the `aligner` parser."""
    url_help = "database URL (default: env ALIGNER_DATABASE_URL, else a SQLite file under ALIGNER_DATA_DIR)"
    db = sub.add_parser("db", help="create, upgrade or downgrade the training service's database (Alembic)")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="migrate to a newer revision (default: the newest)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    up.add_argument("--database-url", help=url_help)
    down = db_sub.add_parser("downgrade", help="migrate back to revision REV ('base': drop every table)")
    down.add_argument("revision", help="target revision, e.g. base or -1")
    down.add_argument("--database-url", help=url_help)
    db.set_defaults(func=_cmd_db)

    token = sub.add_parser("token", help="manage bearer tokens of the training service's REST API")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token (and the user, if new); prints it once")
    create.add_argument("--user", required=True, help="user name")
    create.add_argument("--name", default="", help="a label for the token, e.g. laptop")
    create.add_argument("--admin", action="store_true", help="make the user an operator (admin)")
    create.add_argument("--expires", type=_positive_days, metavar="DAYS", help="the token stops working after DAYS")
    listing = token_sub.add_parser("list", help="every token: user, role, label, dates and whether it is active")
    revoke = token_sub.add_parser("revoke", help="revoke a token at once (it stays listed as revoked)")
    revoke.add_argument("id", type=int, help="the token's id, as `aligner token list` shows it")
    for command in (create, listing, revoke):
        command.add_argument("--database-url", help=url_help)
    token.set_defaults(func=_cmd_token)

    _add_catalogue_commands(sub, url_help)

    up = sub.add_parser("up", help="start the whole service locally: database, broker, reward server, worker, API")
    up.add_argument("--data-dir", default="aligner_data", help="database, runs, logs and stack.json go here")
    up.add_argument("--host", default="127.0.0.1", help="address of the API (default 127.0.0.1)")
    up.add_argument("--port", type=int, help="API port (default: a free one)")
    up.add_argument("--reward-model", help="serve this reward model (Hugging Face folder) with aligner serve-reward")
    up.add_argument("--reward-function", help="or serve this reward function 'module:callable'")
    up.add_argument("--demo", action="store_true", help="build the demo assets if needed and submit a demo job")
    up.add_argument("--exit-after-demo", action="store_true", help="with --demo: stop the stack when the job ends")
    up.set_defaults(func=_cmd_up)

    ui = sub.add_parser("ui", help="serve the dashboard (Gradio), a client of the training service's REST API")
    ui.add_argument(
        "--api-url",
        default=None,
        help="the REST API's base URL (default: env ALIGNER_API_URL, else http://127.0.0.1:5000)",
    )
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    ui.add_argument(
        "--data-dir",
        default=None,
        help="only for presets: the demo tiny model in DATA_DIR/demo_assets (default: env ALIGNER_DATA_DIR)",
    )
    ui.set_defaults(func=_cmd_ui)
