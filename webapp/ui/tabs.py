"""The dashboard's Gradio layout: the sign-in header, then one builder per tab that lays it out and wires its events.

The timer does not redraw anything itself: each tick asks the API what the dashboard shows has become (the jobs list
and the selected job's newest event: `Session.watch`) and keeps it in the `seen` state. Only when that changed do the
Jobs table and then the open tab refresh (`wire_ticks`: one event, whatever the number of tabs), each redrawing what
changed (gr.skip() otherwise). With nothing running, the page stays still: an event with visible outputs redraws
their status even when it changes no value, and every event is a round trip through Gradio's queue (issue 30: a
finished job's page cost 55% of a core in Chromium and 17% in the dashboard when every tick refreshed every tab).

A token the API rejects (401: wrong, expired or revoked) is dropped at once, signing the tab out: asking again with it
would only count as failed sign-ins, and enough of those get the address's failed attempts refused (429). The watch
drops it, one request a tick at most. The API sees each browser's address, not the dashboard's, when it trusts the
dashboard as a proxy (`forwarded_for`).

No `from __future__ import annotations` here: Gradio reads a handler's `gr.SelectData` hint as a class, not a string.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from webapp.ui import catalogue
from webapp.ui.api import REJECTED, Api, ApiError
from webapp.ui.frames import jobs_frame
from webapp.ui.job_view import ACTIVE

REFRESH_S = 2.0  # the watch's period while a job is queued or running
# ... and while none is: Gradio copies every shown value of the page on every event (its loading statuses), so a tick
# of a Job page with its charts costs the browser ~0.3 s of CPU (issue 30: an idle page's CPU).
IDLE_REFRESH_S = 30.0
JOBS, ADMIN_JOBS = "/jobs", "/admin/jobs"  # a user's own jobs; every user's (admins), with the same actions
FORBIDDEN = 403  # the API's answer to a user who is not an admin
SIGNED_OUT = f"Signed out ({REJECTED})."


@dataclass
class TickRefresh:
    """A tab's refresh on the timer: `fn(*inputs)` -> a value (or gr.skip()) for each of `outputs`."""

    tab: str
    fn: Callable
    inputs: list
    outputs: list


def unchanged_value(value) -> bool:
    """Whether a handler's output value leaves its component as it is (gr.skip(), an empty gr.update())."""
    return isinstance(value, dict) and value == gr.skip()


def set_in_browser(triggers: list, outputs: list, values: list) -> None:
    """On any of `triggers`, `outputs` take `values` (what each shows once its component has postprocessed it) in the
    browser itself, with no round trip through Gradio's queue.

    Why: a reset sent to the server is one more queued event, and under load it lands after the answer of an event
    the user started later (the submit's field errors, a try's result, an upload's line) and wipes it, or leaves
    that output's progress timer standing (CI, issue 30). Run in the browser, it is done before the next click.
    `browser_values` reads the values back.
    """
    shown = []
    for output, value in zip(outputs, values, strict=True):
        value = output.postprocess(value)
        shown.append(value.model_dump() if hasattr(value, "model_dump") else value)
    js = f"() => {json.dumps(shown[0] if len(shown) == 1 else shown)}"
    gr.on(triggers, None, None, outputs, js=js, show_progress="hidden", queue=False)


def browser_values(fn) -> list:
    """The values that `fn` (a Gradio BlockFunction that `set_in_browser` made) gives its outputs, one per output."""
    values = json.loads(fn.js.removeprefix("() => "))
    return values if len(fn.outputs) > 1 else [values]


def _distinct(components) -> list:
    """`components` in order, each once (a component feeds or shows in several tabs' refreshes)."""
    seen: dict[int, Any] = {}
    for component in components:
        seen.setdefault(id(component), component)
    return list(seen.values())


@dataclass
class Session:
    """What every tab shares: the API's URL, the signed-in token, the selected job, the refresh timer and the
    header's sign-in line."""

    api_url: str
    token: gr.State
    job_id: gr.Number
    timer: gr.Timer
    signed: gr.Markdown
    open_tab: gr.State | None = None  # the id of the tab on screen: only its refreshes run on the timer
    seen: gr.State | None = None  # what the watch last saw (`watch`): its change refreshes what is shown
    ticked: Any = None  # the Jobs table's refresh on a change of `seen` (jobs_tab): the tab refreshes follow it
    all_users: gr.Checkbox | None = None  # the Jobs tab's "All users" (admins only): every user's jobs
    refreshes: list[TickRefresh] = field(default_factory=list)  # every_tick's, wired by wire_ticks

    def api(self, token: str | None) -> Api:
        if not token:
            raise ApiError(401, "sign in with your API token first")
        return Api(self.api_url, token, forwarded_for())

    @property
    def auth_outputs(self) -> list:
        """What a handler returns `signed_out()` or `unchanged()` into, after its own outputs."""
        return [self.token, self.signed]

    @staticmethod
    def signed_out() -> list:
        return ["", SIGNED_OUT]

    @staticmethod
    def unchanged() -> list:
        return [gr.update(), gr.update()]

    def sign_in(self, token: str, selected=None) -> list:
        """[token, sign-in line, Jobs table, All users box]: the token kept when the API knows it (GET /me); the
        table lists the user's own jobs, and the box (off) is shown to an admin only."""
        token = (token or "").strip()
        try:
            api = Api(self.api_url, token, forwarded_for())
            me = api.get("/me")
            table = jobs_frame(api.get(JOBS, per_page=100), selected=job_id_of(selected))
        except ApiError as err:
            return ["", f"Sign-in failed: {err.message}", gr.update(), gr.update()]
        line = f"Signed in as **{me['name']}**{' (admin)' if me['is_admin'] else ''}."
        return [token, line, table, gr.update(visible=bool(me["is_admin"]), value=False)]

    def refresh_jobs(self, token: str, selected=None, all_users: bool = False) -> list:
        """[Jobs table, token, sign-in line]: the table's new value (the `selected` job marked), no change when
        signed out or the API fails; a rejected token is dropped. `all_users`: every user's jobs with their owner
        (GET /admin/jobs), or the user's own when the API refuses that (403: not an admin)."""
        if not token:
            return [gr.update(), *self.unchanged()]
        try:
            page, owners = jobs_page(self.api(token), all_users)
            return [jobs_frame(page, selected=job_id_of(selected), owners=owners), *self.unchanged()]
        except ApiError as err:
            return [gr.update(), *(self.signed_out() if err.rejected else self.unchanged())]

    def watch(self, token: str, selected, all_users: bool, seen, interval: float) -> list:
        """[seen, token, timer]: a value that changes when what the dashboard shows may have (a digest of the jobs
        list, the selected job's id and newest event id), `seen` left as it is otherwise, so that its change event
        fires only then; a rejected token dropped; the timer at REFRESH_S while a listed job is queued or running
        (or the selected one has news), else at IDLE_REFRESH_S (`interval`: the timer's now)."""
        if not token:
            return [gr.skip(), gr.skip(), gr.skip()]
        try:
            api = self.api(token)
            listed = jobs_page(api, all_users)
            jobs = hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()
            live = any(job.get("status") in ACTIVE for job in listed[0].get("items", []))
            jid = job_id_of(selected)
            newest = None
            if jid is not None:
                known = seen[1] if isinstance(seen, list | tuple) and seen[1] and seen[1][0] == jid else None
                after = known[1] if known else 0
                try:
                    new = api.events(jid, after=after or 0)
                    newest = [jid, new[-1]["id"] if new else after]
                    live = live or bool(new and known)
                except ApiError as err:
                    if err.rejected:
                        raise
                    newest = [jid, None]  # not (any more) a job of this user's: its page says so
        except ApiError as err:
            return [gr.skip(), "" if err.rejected else gr.skip(), gr.skip()]
        now = [jobs, newest]
        pace = REFRESH_S if live else IDLE_REFRESH_S
        return [gr.skip() if now == seen else now, gr.skip(), gr.skip() if interval == pace else gr.Timer(pace)]

    def quicken(self, *events) -> None:
        """Each of `events` (a job selected, a job resumed or retried) sets the timer back to REFRESH_S; the watch
        slows it again once it sees nothing running. Not on every change of the Jobs table: each event of the page's
        costs the browser as much as a tick."""
        for event in events:
            event.then(lambda: gr.Timer(REFRESH_S), None, self.timer, show_progress="hidden")

    def every_tick(self, fn: Callable, inputs: list, outputs: list, tab: str) -> None:
        """Run `fn` when the watch sees a change while `tab` is the open one (a hidden tab neither asks the API nor
        redraws: it catches up when opened, as `follow_tab` wires its refresh to the tab's selection). Registered
        here and wired by `wire_ticks` once every tab is laid out."""
        self.refreshes.append(TickRefresh(tab, fn, inputs, outputs))

    def wire_ticks(self) -> None:
        """One event after the Jobs table's refresh runs the open tab's refreshes (one per tab would each be a
        round trip of the browser's)."""
        refreshes = list(self.refreshes)
        inputs = _distinct(c for r in refreshes for c in r.inputs)
        outputs = _distinct(c for r in refreshes for c in r.outputs)
        at = {id(c): i for i, c in enumerate(outputs)}

        def refresh_open_tab(open_tab: str, *values):
            given = {id(c): v for c, v in zip(inputs, values, strict=True)}
            result = [gr.skip()] * len(outputs)
            for r in refreshes:
                if r.tab == open_tab:
                    for component, value in zip(r.outputs, r.fn(*(given[id(c)] for c in r.inputs)), strict=True):
                        if not unchanged_value(value):
                            result[at[id(component)]] = value
            return result

        self.ticked.then(refresh_open_tab, [self.open_tab, *inputs], outputs, show_progress="hidden")

    def follow_tab(self, tab: gr.Tab, tab_id: str, refresh: Callable | None = None, inputs=None, outputs=None) -> None:
        """Selecting `tab` makes it the open one and, with `refresh`, brings its view up to date at once."""
        selected = tab.select(lambda: tab_id, None, self.open_tab, show_progress="hidden")
        if refresh is not None:
            selected.then(refresh, inputs, outputs, show_progress="hidden")


def jobs_page(api: Api, all_users: bool) -> tuple[dict, bool]:
    """(the jobs the table lists, whether they are every user's): with `all_users`, every user's jobs (GET
    /admin/jobs), or the user's own when the API refuses that (403: not an admin)."""
    if all_users:
        try:
            return api.get(ADMIN_JOBS, per_page=100), True
        except ApiError as err:
            if err.status != FORBIDDEN:  # a rejected token is dropped by the caller, after one request
                raise
    return api.get(JOBS, per_page=100), False


def forwarded_for() -> str | None:
    """The `X-Forwarded-For` to send the API for the browser whose event runs now: the chain that reached the
    dashboard with the address it came from appended, as every proxy does (None outside a Gradio event).

    Gradio keeps the event's request in a context variable while the handler runs (gradio.context.LocalContext,
    tests/webapp/test_ui.py pins it). Left of the appended address the chain is whatever the client sent: the API
    reads only as many entries from the right as it has proxies it trusts (ALIGNER_TRUSTED_PROXIES).
    """
    from gradio.context import LocalContext

    request = LocalContext.request.get(None)
    client = getattr(request, "client", None) if request is not None else None
    host = getattr(client, "host", None)
    if not host:
        return None
    headers = {str(name).lower(): value for name, value in dict(request.headers).items()}
    prior = headers.get("x-forwarded-for", "").strip()
    return f"{prior}, {host}" if prior else host


@dataclass
class SignIn:
    """The header's sign-in widgets, wired once the Jobs table they fill exists."""

    token_box: gr.Textbox
    button: gr.Button
    message: gr.Markdown


def job_id_of(value) -> int | None:
    try:
        number = int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and number >= 1 else None  # an empty gr.Number reads 0


def header(api_url: str) -> tuple[Session, SignIn]:
    """The title, the token box, the selected job id and the timer every tab refreshes on."""
    token_state = gr.State("")
    gr.Markdown(f"# Aligner\nREINFORCE / RLOO and PPO training jobs at `{api_url}`")
    with gr.Row():
        token_box = gr.Textbox(
            label="API token",
            type="password",
            elem_id="token",
            scale=4,
            placeholder="aligner token create --user NAME",
        )
        sign_in = gr.Button("Sign in", elem_id="sign-in", scale=1)
        job_id = gr.Number(label="Selected job id", precision=0, elem_id="job-id", scale=1)
    signed = gr.Markdown("Not signed in.", elem_id="signed-in")
    timer = gr.Timer(REFRESH_S)
    session = Session(api_url, token_state, job_id, timer, signed, open_tab=gr.State("jobs"), seen=gr.State(None))
    return session, SignIn(token_box, sign_in, signed)


def wire_sign_in(session: Session, sign_in: SignIn, jobs_table: gr.Dataframe) -> None:
    """Signing in checks the token against the API, keeps it in the session and fills the Jobs table (the tabs that
    depend on who is signed in follow the token's changes)."""
    outputs = [session.token, sign_in.message, jobs_table, session.all_users]
    sign_in.button.click(session.sign_in, [sign_in.token_box, session.job_id], outputs)
    sign_in.token_box.submit(session.sign_in, [sign_in.token_box, session.job_id], outputs)
    session.token.change(token_dropped, [session.token, sign_in.message], [sign_in.message], show_progress="hidden")


def token_dropped(token: str, line: str):
    """The sign-in line once the watch dropped a rejected token (a failed sign-in says so itself)."""
    return SIGNED_OUT if not token and str(line or "").startswith("Signed in") else gr.skip()


def catalogue_action(session: Session, action: Callable[..., str], token: str, *args) -> list:
    """[message, the 4 tables (models, functions, servers, datasets), token, sign-in line]: `action` (one of
    webapp.ui.catalogue's register / remove / share, given the Api and `args`) done, or why the API refused it."""
    keep = [gr.update()] * 4
    if not token:
        return ["Sign in first.", *keep, *session.unchanged()]
    try:
        api = session.api(token)
        message = action(api, *args)
        tables = list(catalogue.tables(api).values())
    except ApiError as err:
        if err.rejected:
            return [f"**Refused**: {REJECTED}", *keep, *session.signed_out()]
        return [f"**Refused** ({err.status}): {err.describe()}", *keep, *session.unchanged()]
    return [message, *tables, *session.unchanged()]


def catalogue_view(session: Session, token: str) -> list:
    """[the tab's visibility, message, the 4 tables]: shown, and filled, for an admin only (GET /me)."""
    hidden = [gr.update(visible=False), "", *catalogue.empty_tables().values()]
    if not token:
        return hidden
    try:
        api = session.api(token)
        if not api.get("/me")["is_admin"]:
            return hidden
        tables = list(catalogue.tables(api).values())
    except ApiError as err:  # a rejected token: the Jobs table's refresh signs the tab out
        return [gr.update(), f"**The catalogue could not be loaded**: {err.message}", *[gr.update()] * 4]
    return [gr.update(visible=True), "", *tables]


def ask_to_remove(what: str, name: str) -> list:
    """[the confirmation row, its question, the message under the form, the entry asked about]: Remove only asks;
    the confirmation removes the entry asked about, whatever the form holds by then."""
    if what not in catalogue.ENTRY_LISTS or not str(name or "").strip():
        return [gr.update(visible=False), "", "Give the name of the entry to remove.", None]
    return [gr.update(visible=True), catalogue.removal_question(what, name), "", [what, str(name).strip()]]


def catalogue_tab(session: Session) -> None:
    """Admins only (hidden for others): the models, reward functions and servers jobs may use, and the datasets the
    admin sees; register or remove an entry (after a confirmation that says what it does), share or unshare a
    dataset. Each action's outcome shows under its own form, where the button was clicked. The API checks every
    change itself."""
    with gr.Tab("Catalogue", id="catalogue", visible=False) as tab:
        gr.Markdown(
            "What jobs may name: models (Hugging Face folders on the API's server), reward functions "
            "(`module:callable`, importable by the workers: register only code you trust), reward and critic "
            "servers, and datasets (uploads; shared ones every user may use)."
        )
        with gr.Row():
            refresh = gr.Button("Refresh", elem_id="cat-refresh", scale=1)
            message = gr.Markdown(elem_id="cat-msg")
        empty = catalogue.empty_tables()
        models = gr.Dataframe(empty["models"], interactive=False, wrap=True, label="Models", elem_id="cat-models")
        functions = gr.Dataframe(
            empty["functions"],
            interactive=False,
            wrap=True,
            label="Reward functions",
            elem_id="cat-functions",
            column_widths=list(catalogue.FUNCTION_WIDTHS),
        )
        servers = gr.Dataframe(empty["servers"], interactive=False, wrap=True, label="Servers", elem_id="cat-servers")
        datasets = gr.Dataframe(
            empty["datasets"], interactive=False, wrap=True, label="Datasets you see", elem_id="cat-datasets"
        )
        gr.Markdown("**Register a model** (a folder on the API's server: config.json and weights)")
        with gr.Row():
            m_name = gr.Textbox(label="Name", elem_id="cat-m-name")
            m_path = gr.Textbox(label="Folder on the server", elem_id="cat-m-path", scale=2)
            m_kind = gr.Dropdown(list(catalogue.MODEL_KINDS), value="policy", label="Kind", elem_id="cat-m-kind")
            m_desc = gr.Textbox(label="Description", elem_id="cat-m-desc", scale=2)
            m_add = gr.Button("Register model", elem_id="cat-m-add")
        m_msg = gr.Markdown(elem_id="cat-m-msg")
        gr.Markdown("**Register a reward function**")
        with gr.Row():
            f_name = gr.Textbox(label="Name", elem_id="cat-f-name")
            f_target = gr.Textbox(label="package.module:function", elem_id="cat-f-target", scale=2)
            f_desc = gr.Textbox(label="Description", elem_id="cat-f-desc", scale=2)
            f_add = gr.Button("Register function", elem_id="cat-f-add")
        f_msg = gr.Markdown(elem_id="cat-f-msg")
        gr.Markdown("**Register a server**")
        with gr.Row():
            s_name = gr.Textbox(label="Name", elem_id="cat-s-name")
            s_url = gr.Textbox(label="URL", elem_id="cat-s-url", scale=2)
            s_kind = gr.Dropdown(list(catalogue.SERVER_KINDS), value="reward", label="Kind", elem_id="cat-s-kind")
            s_model = gr.Textbox(value="reward_model", label="Model name (reward server)", elem_id="cat-s-model")
            s_desc = gr.Textbox(label="Description", elem_id="cat-s-desc")
            s_add = gr.Button("Register server", elem_id="cat-s-add")
        s_msg = gr.Markdown(elem_id="cat-s-msg")
        gr.Markdown("**Remove an entry** (asked first: jobs that name it are refused when they next start)")
        with gr.Row():
            r_what = gr.Radio(list(catalogue.ENTRY_LISTS), value="model", label="What", elem_id="cat-r-what")
            r_name = gr.Textbox(label="Name", elem_id="cat-r-name")
            r_remove = gr.Button("Remove", variant="stop", elem_id="cat-r-remove")
        with gr.Row(visible=False, elem_id="cat-r-confirm-row") as r_confirm_row:
            r_question = gr.Markdown(elem_id="cat-r-question", scale=3)
            r_confirm = gr.Button("Confirm: remove it", variant="stop", elem_id="cat-r-confirm")
            r_keep = gr.Button("Keep it", elem_id="cat-r-keep")
        r_msg = gr.Markdown(elem_id="cat-r-msg")
        r_asked = gr.State(None)  # [what, name] the question is about
        gr.Markdown("**Share a dataset** with every user, or make it its owner's only again")
        with gr.Row():
            d_id = gr.Number(None, label="Dataset id", precision=0, elem_id="cat-d-id")
            d_share = gr.Button("Share", elem_id="cat-d-share")
            d_unshare = gr.Button("Unshare", elem_id="cat-d-unshare")
        d_msg = gr.Markdown(elem_id="cat-d-msg")

    tables = [models, functions, servers, datasets]

    def wire(button: gr.Button, action: Callable[..., str], inputs: list, shown_in: gr.Markdown) -> None:
        button.click(lambda token, *args: catalogue_action(session, action, token, *args), [session.token, *inputs],
                     [shown_in, *tables, *session.auth_outputs])  # fmt: skip

    def remove_asked(token: str, asked):
        """[the confirmation row, message, the 4 tables, token, sign-in line]: the entry asked about removed."""
        if not asked:
            return [gr.update(visible=False), "Nothing to remove.", *[gr.update()] * 4, *session.unchanged()]
        return [gr.update(visible=False), *catalogue_action(session, catalogue.remove_entry, token, *asked)]

    wire(m_add, catalogue.register_model, [m_name, m_path, m_kind, m_desc], m_msg)
    wire(f_add, catalogue.register_reward_function, [f_name, f_target, f_desc], f_msg)
    wire(s_add, catalogue.register_server, [s_name, s_url, s_kind, s_model, s_desc], s_msg)
    r_remove.click(ask_to_remove, [r_what, r_name], [r_confirm_row, r_question, r_msg, r_asked])
    r_confirm.click(remove_asked, [session.token, r_asked], [r_confirm_row, r_msg, *tables, *session.auth_outputs])
    r_keep.click(lambda: (gr.update(visible=False), "Kept."), None, [r_confirm_row, r_msg])
    wire(d_share, lambda api, number: catalogue.share_dataset(api, number, True), [d_id], d_msg)
    wire(d_unshare, lambda api, number: catalogue.share_dataset(api, number, False), [d_id], d_msg)
    session.follow_tab(tab, "catalogue")
    for trigger in (session.token.change, refresh.click):
        trigger(lambda token: catalogue_view(session, token), [session.token], [tab, message, *tables])
