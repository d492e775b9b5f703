"""``banditstream serve``: the Personalizer-compatible REST service.

Services written against the retired hosted Personalizer (its REST API or its client
libraries, in any language) switch by changing the endpoint and the key. Every rank is a
:class:`~banditstream.decider.Decider` decision: the same verified snapshots, the same local
decide step, the same DecisionEvent on Kafka as the Python SDK. The service keeps no state a
replica must share (see ``serve.check_event_ids`` for the one per-process check).

    settings = load_settings("banditstream.yaml")      # serve.keys, serve.routes, ...
    app = ServeApp(settings, freeze_gc=True).asgi()                     # a Starlette app
    uvicorn.run(app, host="127.0.0.1", port=8080)       # or: banditstream serve

Both forms of the API the clients use are answered:

* v1.0: ``/personalizer/v1.0/rank``, ``.../events/{eventId}/reward``, ``.../activate``,
  ``.../configurations/service``, ``.../configurations/policy``, ``.../model``,
  ``.../model/properties``, ``.../logs``, ``.../logs/properties``, ``.../evaluations`` and
  ``.../evaluations/{evaluationId}`` (offline evaluations: :mod:`banditstream.serve_evaluations`);
* 2022-09-01-preview: the same under ``/personalizer/...?api-version=2022-09-01-preview``
  (an evaluation is created with PUT ``evaluations/{evaluationId}``), plus ``multislot/rank``,
  ``multislot/events/{eventId}/reward``, ``.../activate``,
  ``configurations/applyFromEvaluation``, ``featureImportances`` and
  ``featureImportances/{featureImportanceId}`` (jobs run on the service's one job thread:
  :mod:`banditstream.serve_feature_importances`);

and ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus) and ``/openapi.json`` (the
operations served, from the public API definition; ``?api-version=`` picks the version).
banditstream's own ``/v1/stats?domain=&window=`` answers the domain's per-arm statistics and
leaderboard (:mod:`banditstream.stats`, as ``banditstream stats``), with the same key.

Per request: the ``Ocp-Apim-Subscription-Key`` header is compared (constant time) with every
configured key; the key's name picks the tenant, workspace and domain (``serve.routes``;
``?domain=`` may pick another the route allows). The body is read up to
``serve.max_body_bytes`` (413 past it), parsed and validated (:mod:`banditstream.serve_api`),
and answered with the status codes and bodies of the API definition. Errors are
``{"error": {"code", "message", "target"}}``, the message starting with the offending field.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from banditstream import serve_api as api
from banditstream import serve_evaluations as evals
from banditstream import serve_feature_importances as importances
from banditstream.config import ConfigError, Settings
from banditstream.serve_api import PREVIEW, V1, ApiError
from banditstream.serve_domains import DomainLoop, Ranked, Where
from streams.errors import BanditstreamError

log = logging.getLogger("banditstream.serve")

KEY_HEADER = "ocp-apim-subscription-key"
DASHBOARD_COOKIE = "banditstream_key"
OPENAPI_DIR = Path(__file__).parent / "openapi"
_KEY_DIR_RELOAD_S = 10.0
_JSON = "application/json; charset=utf-8"


class ServeMetrics:
    """Requests by route, method and status, and their latency; the Deciders' metrics beside them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "banditstream_serve_requests", "HTTP requests answered, by route, method and status.", ["route", "method", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "banditstream_serve_request_seconds", "Time from the request's arrival to its answer, by route and method.",
            ["route", "method"], registry=self.registry,
            buckets=(100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.5, 1.0),
        )  # fmt: skip


class _DeciderMetrics(Collector):
    """Every Decider has its own registry (its series names repeat across domains): merged here
    into one family per name, so the exposition stays valid."""

    def __init__(self, loops: Callable[[], list[DomainLoop]]):
        self._loops = loops

    def collect(self):
        families: dict[str, Metric] = {}
        for loop in self._loops():
            for family in loop.decider.metrics.registry.collect():
                held = families.get(family.name)
                if held is None:
                    held = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                held.samples.extend(family.samples)
        return list(families.values())


class _Keys:
    """Key name -> key bytes from ``serve.keys`` and ``serve.key_dir``; the directory is read
    again (at most every 10 s) when a key is not found, so a rotated Secret takes effect."""

    def __init__(self, settings: Settings):
        self._configured = {name: secret.get_secret_value().encode() for name, secret in settings.serve.keys.items()}
        self._dir = Path(settings.serve.key_dir) if settings.serve.key_dir else None
        self._keys = dict(self._configured)
        self._loaded_at = 0.0
        self._load_dir()

    def _load_dir(self) -> None:
        self._loaded_at = time.monotonic()
        if self._dir is None:
            return
        keys = dict(self._configured)
        try:
            entries = sorted(self._dir.iterdir())
        except OSError as exc:
            raise ConfigError(f"serve.key_dir {self._dir}: {exc.strerror}") from None
        for path in entries:
            # a mounted Secret holds ..data symlinks and dot-directories beside the key files
            if path.name.startswith(".") or not path.is_file():
                continue
            value = path.read_bytes().strip()
            if value:
                keys[path.name] = value
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, presented: str | None) -> str | None:
        """The name of the key presented, or None. Every key is compared, each in constant time."""
        if presented is None:
            return None
        found = self._match(presented.encode())
        if found is None and self._dir is not None and time.monotonic() - self._loaded_at > _KEY_DIR_RELOAD_S:
            try:
                self._load_dir()
            except ConfigError as exc:
                log.warning("%s", exc)
            found = self._match(presented.encode())
        return found

    def _match(self, presented: bytes) -> str | None:
        found = None
        for name, key in self._keys.items():
            if hmac.compare_digest(presented, key):
                found = name
        return found


class ServeApp:
    """The service: keys, one :class:`DomainLoop` per tenant/workspace/domain, the routes."""

    def __init__(self, settings: Settings, *, seed: int | None = None, freeze_gc: bool = False):
        self.settings = settings
        self.freeze_gc = freeze_gc
        self.keys = _Keys(settings)
        if not len(self.keys):
            raise ConfigError("serve: no keys configured; set serve.keys (e.g. BANDITSTREAM_SERVE__KEYS__APP=...) or serve.key_dir")
        self.metrics = ServeMetrics()
        self.metrics.registry.register(_DeciderMetrics(lambda: list(self._loops.values())))
        self.seed = seed
        self._loops: dict[Where, DomainLoop] = {}
        self._building: dict[Where, threading.Lock] = {}
        self._lock = threading.Lock()
        self.ready = False
        self._specs = {version: json.loads((OPENAPI_DIR / f"personalizer-{version}.json").read_text()) for version in api.API_VERSIONS}
        self._log_range: tuple[float, dict[str, Any]] | None = None
        #: the jobs the API submits (feature importances), one at a time: the service's requests keep the other cores
        self.jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="banditstream-serve-job")

    # -- domains --------------------------------------------------------------------------

    def where(self, key_name: str, domain: str | None = None) -> Where:
        """Where a key's calls go; ``domain`` (from ``?domain=``) must be one its route allows."""
        s = self.settings
        route = s.serve.routes.get(key_name)
        default = (route.domain if route and route.domain else None) or s.serve.domain
        if domain is not None and domain != default:
            if route is None or domain not in route.domains:
                raise ApiError(f"domain: {domain!r} is not open to this key", "forbidden", field="domain")
        return Where(
            (route.tenant if route else None) or s.tenant, (route.workspace if route else None) or s.workspace, domain or default
        )

    def loop(self, where: Where) -> DomainLoop:
        """The domain's loop, built on first use (in a worker thread: it pulls a snapshot)."""
        held = self._loops.get(where)
        if held is not None:
            return held
        with self._lock:
            lock = self._building.setdefault(where, threading.Lock())
        with lock:
            held = self._loops.get(where)
            if held is None:
                held = DomainLoop(where, self.settings, seed=self.seed)
                self._loops[where] = held
                log.info("serving %s (snapshot %s)", where, held.decider.policy_version or "none: the baseline decides")
        return held

    def start(self) -> None:
        """Build the loops every key routes to by default; then the service is ready."""
        names = set(self.keys._keys) | set(self.settings.serve.routes)  # noqa: SLF001
        for where in sorted({self.where(name) for name in names}, key=str):
            self.loop(where)
        self.ready = True

    def close(self) -> None:
        # queued jobs are dropped (their records stay Running in their files and read back Failed
        # at the next start); the running one finishes
        self.jobs.shutdown(wait=False, cancel_futures=True)
        for loop in list(self._loops.values()):
            report = loop.close()
            if report is not None and getattr(report, "spooled", 0):
                log.warning("%s: %s events stay in the spool", loop.where, report.spooled)

    # -- the ASGI app ---------------------------------------------------------------------

    def asgi(self) -> Starlette:
        routes: list[Route] = []
        v1 = "/personalizer/v1.0"
        pv = "/personalizer"
        ops: list[tuple[str, str, list[str], Callable, tuple[str, ...]]] = [
            ("/rank", "rank", ["POST"], self.rank, (V1, PREVIEW)),
            ("/events/{eventId}/reward", "reward", ["POST"], self.reward, (V1, PREVIEW)),
            ("/events/{eventId}/activate", "activate", ["POST"], self.activate, (V1, PREVIEW)),
            ("/configurations/service", "service_configuration", ["GET", "PUT"], self.service_configuration, (V1, PREVIEW)),
            ("/configurations/policy", "policy", ["GET", "PUT", "DELETE"], self.policy, (V1, PREVIEW)),
            ("/model", "model", ["GET", "DELETE"], self.model, (V1, PREVIEW)),
            ("/model/properties", "model_properties", ["GET"], self.model_properties, (V1, PREVIEW)),
            ("/logs", "logs", ["DELETE"], self.logs, (V1, PREVIEW)),
            ("/logs/properties", "log_properties", ["GET"], self.log_properties, (V1, PREVIEW)),
            ("/multislot/rank", "multislot_rank", ["POST"], self.multislot_rank, (PREVIEW,)),
            ("/multislot/events/{eventId}/reward", "multislot_reward", ["POST"], self.multislot_reward, (PREVIEW,)),
            ("/multislot/events/{eventId}/activate", "multislot_activate", ["POST"], self.multislot_activate, (PREVIEW,)),
            # v1.0 creates an evaluation with POST /evaluations, the preview with PUT /evaluations/{evaluationId}
            ("/evaluations", "evaluations", ["GET", "POST"], self.evaluations, (V1,)),
            ("/evaluations", "evaluations", ["GET"], self.evaluations, (PREVIEW,)),
            ("/evaluations/{evaluationId}", "evaluation", ["GET", "DELETE"], self.evaluation, (V1,)),
            ("/evaluations/{evaluationId}", "evaluation", ["GET", "PUT", "DELETE"], self.evaluation, (PREVIEW,)),
            ("/configurations/applyFromEvaluation", "apply_from_evaluation", ["POST"], self.apply_from_evaluation, (PREVIEW,)),
            ("/featureImportances", "feature_importances", ["GET"], self.feature_importances, (PREVIEW,)),
            ("/featureImportances/{featureImportanceId}", "feature_importance", ["GET", "PUT", "DELETE"], self.feature_importance,
             (PREVIEW,)),
        ]
        for path, name, methods, handler, versions in ops:
            if V1 in versions:
                routes.append(Route(v1 + path, self._endpoint(v1 + path, handler, V1), methods=methods, name=f"v1_{name}"))
            if PREVIEW in versions:
                routes.append(Route(pv + path, self._endpoint(pv + path, handler, PREVIEW), methods=methods, name=f"preview_{name}"))
        routes += [
            Route("/v1/stats", self._endpoint("/v1/stats", self.stats, V1), methods=["GET"], name="stats"),
            Route("/", self._plain("/", self.dashboard), methods=["GET"], name="dashboard"),
            Route("/dashboard/login", self._plain("/dashboard/login", self.dashboard_login), methods=["POST"]),
            Route("/favicon.ico", self._plain("/favicon.ico", _favicon), methods=["GET"]),
            Route("/healthz", self._plain("/healthz", self.healthz), methods=["GET"]),
            Route("/readyz", self._plain("/readyz", self.readyz), methods=["GET"]),
            Route("/metrics", self._plain("/metrics", self.prometheus), methods=["GET"]),
            Route("/openapi.json", self._plain("/openapi.json", self.openapi), methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_error}, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        """Domains are built in a thread after the server listens: /readyz says when they are."""
        asyncio.get_running_loop().run_in_executor(None, self._start_logged)
        yield
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _start_logged(self) -> None:
        try:
            self.start()
        except Exception:  # noqa: BLE001 - /readyz stays 503 and says so in the log
            log.exception("serve: building the domains failed")
            return
        if self.freeze_gc:
            # Everything built so far (modules, snapshots, clients) lives as long as the
            # process: out of the collector's sight, so its full passes (~40 ms over the whole
            # heap here) stop stalling requests.
            gc.collect()
            gc.freeze()

    def _endpoint(self, route: str, handler: Callable[..., Awaitable[Response]], version: str):
        requests, latency = self.metrics.requests, self.metrics.latency

        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                if version == PREVIEW:
                    _check_api_version(request)
                key_name = self.keys.match(request.headers.get(KEY_HEADER))
                if key_name is None:
                    raise ApiError(
                        "Ocp-Apim-Subscription-Key: access denied due to a missing or invalid subscription key", "unauthorized",
                        field="Ocp-Apim-Subscription-Key",
                    )  # fmt: skip
                where = self.where(key_name, request.query_params.get("domain"))
                loop = self._loops.get(where) or await asyncio.get_running_loop().run_in_executor(None, self.loop, where)
                response = await handler(request, loop, version)
            except ApiError as exc:
                response = _error(exc, version)
            except BanditstreamError as exc:  # the Decider refused the event (a size limit, a non-finite feature)
                response = _error(ApiError(str(exc), field=exc.field, code="InvalidRankRequest"), version)
            except Exception:  # noqa: BLE001 - one bad request never stops the service
                log.exception("%s %s failed", request.method, route)
                response = _error(ApiError("the service failed to answer; see its log", "internal"), version)
            requests.labels(route, request.method, str(response.status_code)).inc()
            latency.labels(route, request.method).observe(time.perf_counter() - started)
            return response

        return endpoint

    def _plain(self, route: str, handler: Callable[[Request], Awaitable[Response]]):
        async def endpoint(request: Request) -> Response:
            response = await handler(request)
            self.metrics.requests.labels(route, request.method, str(response.status_code)).inc()
            return response

        return endpoint

    async def _http_error(self, request: Request, exc: HTTPException) -> Response:
        """Unknown paths (404) and methods (405) answer in the API's error format too."""
        version = PREVIEW if request.url.path.startswith("/personalizer/") and not request.url.path.startswith("/personalizer/v1.0/") else V1
        if exc.status_code == 405:
            error = ApiError(f"method: {request.method} is not served for {request.url.path}", "method", field="method")
        elif exc.status_code == 404:
            error = ApiError(f"path: {request.url.path} is not served here", "not_found", field="path")
        else:
            error = ApiError(str(exc.detail), "bad_request")
        response = _error(error, version)
        if exc.status_code == 405 and exc.headers:
            response.headers.update(exc.headers)
        self.metrics.requests.labels("unmatched", request.method, str(response.status_code)).inc()
        return response

    async def _body(self, request: Request, required: bool = True) -> Any:
        limit = self.settings.serve.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError(f"body: {int(length)} bytes; at most {limit} are accepted (serve.max_body_bytes)", "too_large", field="body")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(f"body: more than {limit} bytes; at most {limit} are accepted (serve.max_body_bytes)", "too_large",
                               field="body")  # fmt: skip
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not required and not raw.strip():
            return None
        return api.parse_json(raw)

    # -- events ---------------------------------------------------------------------------

    async def rank(self, request: Request, loop: DomainLoop, version: str) -> Response:
        rank = api.parse_rank(await self._body(request))
        candidates = rank.candidates()
        event_id = rank.event_id or os.urandom(16).hex()
        decision = loop.decide(rank.context, candidates, event_id, rank.defer)
        loop.events.add(event_id, Ranked(time.time(), rank.defer))
        body = {
            "ranking": api.ranking(rank.actions, candidates, decision.index, decision.probabilities),
            "eventId": event_id,
            "rewardActionId": decision.action,
        }
        return _json(body, 201)

    async def multislot_rank(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """Slot by slot, in request order: each slot chooses among the actions it does not
        exclude and no earlier slot took, its baseline first; one decision per slot."""
        rank = api.parse_multislot_rank(await self._body(request))
        event_id = rank.event_id or os.urandom(16).hex()
        taken: set[str] = set()
        slots = []
        for i, slot in enumerate(rank.slots):
            open_ = [a for a in rank.actions if a["id"] not in slot.excluded and a["id"] not in taken]
            if not open_:
                raise api.bad(f"slots[{i}]", "no action is left for this slot (all excluded or taken by earlier slots)",
                              "InvalidRankRequest")  # fmt: skip
            open_.sort(key=lambda a: a["id"] != slot.baseline)  # the baseline first: the Decider's baseline
            context = api.merge_features(rank.context, slot.features)
            decision = loop.decide(context, open_, api.slot_event_id(event_id, slot.id), rank.defer)
            taken.add(decision.action)
            slots.append({"id": slot.id, "rewardActionId": decision.action})
        loop.events.add(event_id, Ranked(time.time(), rank.defer, tuple(s.id for s in rank.slots)))
        return _json({"slots": slots, "eventId": event_id}, 201)

    async def stats(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """banditstream's own: the domain's per-arm statistics and leaderboard (``window``:
        seconds, or 15m, 24h, 7d; ``level`` of the intervals), as ``banditstream stats``."""
        from banditstream.stats import parse_window

        try:
            window_s = parse_window(request.query_params.get("window", "1h"))
        except ValueError as exc:
            raise api.bad("window", str(exc)) from None
        try:
            level = float(request.query_params.get("level", "0.95"))
        except ValueError:
            level = math.nan
        if not 0.5 <= level < 1.0:
            raise api.bad("level", f"{request.query_params.get('level')!r} is not an interval level in [0.5, 1)")
        board = await asyncio.get_running_loop().run_in_executor(None, loop.stats, window_s, level)
        return _json(board.to_dict(), 200)

    # -- the dashboard --------------------------------------------------------------------

    async def dashboard(self, request: Request) -> Response:
        """The domain's page (:mod:`banditstream.dashboard`): the key from the header or the
        cookie the login form sets; ``?domain=``, ``?window=`` (default 1h), ``?cost=`` and
        ``?quality=`` (the signal names of the cost-quality chart)."""
        from banditstream.dashboard import render
        from banditstream.stats import parse_window

        key_name = self.keys.match(request.headers.get(KEY_HEADER) or request.cookies.get(DASHBOARD_COOKIE))
        if key_name is None:
            return HTMLResponse(_login_page(""), status_code=401)
        query = request.query_params
        window = query.get("window", "1h")
        try:
            window_s = parse_window(window)
            where = self.where(key_name, query.get("domain"))
        except (ValueError, ApiError) as exc:
            return HTMLResponse(_message_page(str(exc)), status_code=400)
        loop = self._loops.get(where) or await asyncio.get_running_loop().run_in_executor(None, self.loop, where)
        build = functools.partial(loop.dashboard, window_s, cost_signal=query.get("cost", "cost"),
                                  quality_signal=query.get("quality", "quality"))
        try:
            view = await asyncio.get_running_loop().run_in_executor(None, build)
        except Exception:  # noqa: BLE001 - one bad page never stops the service
            log.exception("dashboard of %s failed", where)
            return HTMLResponse(_message_page("the dashboard could not be built; see the service's log"), status_code=500)
        return HTMLResponse(render(view, window=window))

    async def dashboard_login(self, request: Request) -> Response:
        """The login form's POST: a valid key is kept in an HttpOnly, same-site cookie."""
        from urllib.parse import parse_qs

        body = await request.body()
        key = (parse_qs(body[:4096].decode("utf-8", "replace")).get("key") or [""])[0]
        if self.keys.match(key) is None:
            return HTMLResponse(_login_page("That key is not valid."), status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(DASHBOARD_COOKIE, key, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return response

    def _known(self, loop: DomainLoop, event_id: str, code: str) -> Ranked | None:
        ranked = loop.events.get(event_id)
        if ranked is None and self.settings.serve.check_event_ids and loop.events.surely_unknown(event_id, loop.window_s):
            raise ApiError(f"eventId: {event_id!r} was not ranked here within the reward wait time", "not_found",
                           code=code, field="eventId")  # fmt: skip
        return ranked

    async def reward(self, request: Request, loop: DomainLoop, version: str) -> Response:
        event_id = api.check_event_id(request.path_params["eventId"], "InvalidRewardRequest")
        value = api.parse_reward(await self._body(request))
        ranked = self._known(loop, event_id, "InvalidRewardRequest")
        if ranked is not None and ranked.slots is not None:
            raise api.bad("eventId", f"{event_id!r} is a multi-slot event; reward it with multislot/events/{{eventId}}/reward",
                          "InvalidRewardRequest")  # fmt: skip
        loop.reward(event_id, value)
        return Response(status_code=204)

    async def activate(self, request: Request, loop: DomainLoop, version: str) -> Response:
        event_id = api.check_event_id(request.path_params["eventId"], "InvalidEventIdToActivate")
        await self._body(request, required=False)
        ranked = self._known(loop, event_id, "InvalidEventIdToActivate")
        if ranked is not None and ranked.slots is not None:
            raise api.bad("eventId", f"{event_id!r} is a multi-slot event; activate it with multislot/events/{{eventId}}/activate",
                          "InvalidEventIdToActivate")  # fmt: skip
        if ranked is None or ranked.deferred:  # an event ranked elsewhere may be deferred: activate it
            loop.activate(event_id)
        return Response(status_code=204)

    def _slots(self, loop: DomainLoop, event_id: str, code: str) -> tuple[str, ...]:
        ranked = self._known(loop, event_id, code)
        if ranked is None:
            raise ApiError(f"eventId: {event_id!r} was not ranked by this replica; its slots are unknown here", "not_found",
                           code=code, field="eventId")  # fmt: skip
        if ranked.slots is None:
            raise api.bad("eventId", f"{event_id!r} is a single-slot event; use events/{{eventId}}/...", code)
        return ranked.slots

    async def multislot_reward(self, request: Request, loop: DomainLoop, version: str) -> Response:
        code = "InvalidRewardRequest"
        event_id = api.check_event_id(request.path_params["eventId"], code)
        rewards = api.parse_multislot_reward(await self._body(request))
        slots = set(self._slots(loop, event_id, code))
        for i, (slot, _) in enumerate(rewards):
            if slot not in slots:
                raise api.bad(f"reward[{i}].slotId", f"{slot!r} is not a slot of event {event_id!r}", code)
        for slot, value in rewards:
            loop.reward(api.slot_event_id(event_id, slot), value)
        return Response(status_code=204)

    async def multislot_activate(self, request: Request, loop: DomainLoop, version: str) -> Response:
        code = "InvalidEventIdToActivate"
        event_id = api.check_event_id(request.path_params["eventId"], code)
        await self._body(request, required=False)
        ranked = loop.events.get(event_id)
        for slot in self._slots(loop, event_id, code):
            if ranked.deferred:
                loop.activate(api.slot_event_id(event_id, slot))
        return Response(status_code=204)

    # -- configuration --------------------------------------------------------------------

    async def service_configuration(self, request: Request, loop: DomainLoop, version: str) -> Response:
        if request.method == "PUT":
            body = await self._body(request)
            try:
                settings, extras = api.update_service_configuration(loop.domain_settings, loop.extras, body, time.time())
            except ApiError as exc:
                exc.code = exc.code or "InvalidServiceConfiguration"
                raise
            await asyncio.get_running_loop().run_in_executor(None, loop.configure, settings, extras)
        return _json(api.service_configuration(loop.domain_settings, loop.extras, version), 200)

    async def policy(self, request: Request, loop: DomainLoop, version: str) -> Response:
        if request.method == "PUT":
            settings = api.update_policy(loop.domain_settings, await self._body(request))
            await asyncio.get_running_loop().run_in_executor(None, loop.configure, settings)
        elif request.method == "DELETE":  # reset: the policy and parameters the config tree gives
            tree = loop.domain_settings.model_dump(mode="json")
            tree["policy"], tree["params"] = loop.base.policy, dict(loop.base.params)
            settings = type(loop.domain_settings).model_validate(tree)
            await asyncio.get_running_loop().run_in_executor(None, loop.configure, settings)
        return _json(api.policy_contract(loop.domain_settings), 200)

    # -- model and logs -------------------------------------------------------------------

    async def model(self, request: Request, loop: DomainLoop, version: str) -> Response:
        if request.method == "DELETE":
            await asyncio.get_running_loop().run_in_executor(None, self._reset_model, loop)
            return Response(status_code=204)
        blob, loaded = await asyncio.get_running_loop().run_in_executor(None, _snapshot_blob, loop)
        target = loaded.target
        headers = {
            "Content-Disposition": f'attachment; filename="{Path(target.path).name}"',
            "X-Banditstream-Snapshot-Version": loaded.version,
            "X-Banditstream-Sha256": target.sha256,
        }
        return Response(blob, 200, headers=headers, media_type="application/octet-stream")

    def _reset_model(self, loop: DomainLoop) -> None:
        """The domain's model back to its priors: reset markers for the learners, then a
        snapshot of the priors, published and pulled (needs the publish keys)."""
        if not self.settings.serve.allow_model_reset:
            raise ApiError("model: reset is off here (serve.allow_model_reset)", "forbidden", field="model")
        from publisher.cli_ops import reset_model

        s, w = self.settings, loop.where
        publisher = s.publisher({w.domain: loop.domain_settings}, tenant=w.tenant, workspace=w.workspace)
        topic = s.topics.updates
        done = reset_model(publisher, w.domain, s.kafka, topic, s.worker_config().serde("update", topic=topic))
        log.warning("%s: model reset: %s", w, done["message"])
        loop.decider.refresh()

    async def model_properties(self, request: Request, loop: DomainLoop, version: str) -> Response:
        client = loop.snapshot_client
        loaded = client.current if client is not None else None
        if loaded is None:
            return _json({}, 200)
        created = api.iso_time(loaded.snapshot.created_at / 1000)
        return _json({"creationTime": created, "lastModifiedTime": created}, 200)

    async def logs(self, request: Request, loop: DomainLoop, version: str) -> Response:
        topics = self.settings.topics
        raise ApiError(f"logs: the logs are the topics {topics.decisions} and {topics.rewards}, deleted by their retention; "
                       "banditstream serve does not delete events", "forbidden", field="logs")  # fmt: skip

    async def log_properties(self, request: Request, loop: DomainLoop, version: str) -> Response:
        body = await asyncio.get_running_loop().run_in_executor(None, self._log_date_range)
        return _json(body, 200)

    def _log_date_range(self) -> dict[str, Any]:
        """The decisions topic's oldest record time to now (cached for a minute)."""
        now = time.time()
        if self._log_range is not None and now - self._log_range[0] < 60:
            return self._log_range[1]
        oldest = _oldest_record_ms(self.settings)
        body = {} if oldest is None else {"dateRange": {"from": api.iso_time(oldest / 1000), "to": api.iso_time(now)}}
        self._log_range = (now, body)
        return body

    # -- evaluations ----------------------------------------------------------------------

    async def evaluations(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """v1.0: POST creates an evaluation (run before the answer, id chosen here), GET lists
        them; preview: GET lists them (EvaluationDetails, ``top``/``skip``/``maxpagesize``)."""
        if request.method == "POST":
            contract = api.parse_evaluation(await self._body(request), loop.domain_settings)
            evaluation_id = str(uuid.uuid4())
            item = await asyncio.get_running_loop().run_in_executor(None, self._evaluate, loop, evaluation_id, contract)
            response = _json(evals.v1_body(item), 201)
            response.headers["Location"] = str(request.url_for("v1_evaluation", evaluationId=evaluation_id))
            return response
        items = loop.evaluations.list()
        if version == V1:
            return _json([evals.v1_body(item) for item in items], 200)
        return _json(_page(request, items, evals.preview_details), 200)

    async def evaluation(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """GET (preview: with the time series' ``startTime``, ``endTime``, ``intervalInMinutes``
        and ``window``), DELETE, and the preview's PUT: create it under this id."""
        evaluation_id = api.check_event_id(request.path_params["evaluationId"], "InvalidEvaluationContract", "evaluationId")
        if request.method == "PUT":
            contract = api.parse_evaluation(await self._body(request), loop.domain_settings)
            loop.evaluations.reserve(evaluation_id)
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._evaluate, loop, evaluation_id, contract)
            finally:
                loop.evaluations.release(evaluation_id)
            return Response(status_code=200)
        if request.method == "DELETE":
            loop.evaluations.delete(evaluation_id)
            return Response(status_code=204)
        item = loop.evaluations.get(evaluation_id)
        if version == V1:
            return _json(evals.v1_body(item), 200)
        query = request.query_params
        since_ms = api.parse_time(query["startTime"], "startTime") if "startTime" in query else None
        until_ms = api.parse_time(query["endTime"], "endTime") if "endTime" in query else None
        interval = _query_int(query, "intervalInMinutes", 5, 1)
        if interval not in evals.INTERVALS:
            raise api.bad("intervalInMinutes", f"is {interval}; use one of {', '.join(map(str, evals.INTERVALS))}")
        window = query.get("window", "Expanding")
        if window not in ("Expanding", "Rolling"):
            raise api.bad("window", f"{window!r} is unknown; use Expanding or Rolling")
        return _json(evals.preview_body(item, since_ms, until_ms, interval, window), 200)

    def _evaluate(self, loop: DomainLoop, evaluation_id: str, contract: api.EvaluationContract) -> evals.StoredEvaluation:
        updates = loop.read_log(contract.since_ms, contract.until_ms)
        w = loop.where
        item = evals.run_evaluation(evaluation_id, contract, updates, (w.tenant, w.workspace, w.domain))
        loop.evaluations.add(item)
        log.info("%s: evaluation %s %s on %s decisions", w, evaluation_id, item.status, item.rows)
        return item

    # -- feature importances --------------------------------------------------------------

    async def feature_importances(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """The list (FeatureImportanceDetails, newest first; ``top``/``skip``/``maxpagesize``)."""
        items = loop.feature_importances.list()
        return _json(_page(request, items, importances.details), 200)

    async def feature_importance(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """PUT submits a job under this id (stored Running, answered at once; it runs on the
        job thread), GET answers it (with ``featureScores`` once Succeeded), DELETE forgets it."""
        feature_importance_id = api.check_event_id(request.path_params["featureImportanceId"], "InvalidContract",
                                                   "featureImportanceId")  # fmt: skip
        store = loop.feature_importances
        if request.method == "PUT":
            contract = api.parse_feature_importance(await self._body(request))
            running = importances.started(feature_importance_id, contract)
            store.start(running)
            self.jobs.submit(self._rate_features, loop, running)
            return Response(status_code=200)
        if request.method == "DELETE":
            store.delete(feature_importance_id)
            return Response(status_code=204)
        return _json(importances.body(store.get(feature_importance_id)), 200)

    def _rate_features(self, loop: DomainLoop, running: importances.StoredFeatureImportance) -> None:
        w = loop.where
        try:
            updates = loop.read_log(running.since_ms, running.until_ms)
            decisions = loop.read_decisions(running.since_ms, running.until_ms)
            done = importances.run_feature_importance(running, updates, decisions, (w.tenant, w.workspace, w.domain))
        except Exception as exc:  # noqa: BLE001 - the job fails (the broker did not answer, ...), the service goes on
            log.exception("%s: feature importance %s failed", w, running.id)
            done = importances.failed(running, f"the log could not be read: {type(exc).__name__}: {exc}")
        loop.feature_importances.finish(running, done)
        log.info("%s: feature importance %s %s on %s decisions", w, running.id, done.status, done.rows)

    async def apply_from_evaluation(self, request: Request, loop: DomainLoop, version: str) -> Response:
        """The evaluated policy ``policyName`` names (the best of that name) becomes the
        domain's policy, as a policy PUT would make it; ``online`` keeps the policy as it is."""
        reference = api.parse_policy_reference(await self._body(request))
        item = loop.evaluations.get(reference.evaluation_id)
        chosen = evals.best_custom(item, reference.policy_name)
        if chosen.source == "Custom":
            try:
                settings = api.update_policy(loop.domain_settings, {"name": chosen.name, "arguments": chosen.arguments})
            except ApiError as exc:  # e.g. a per-arm policy for a domain whose features are shared
                raise api.bad("policyName", f"{chosen.name} {chosen.arguments}: {exc.message}", "InvalidPolicyConfiguration") from None
            await asyncio.get_running_loop().run_in_executor(None, loop.configure, settings)
        elif chosen.source != "Online":
            raise api.bad("policyName", f"{chosen.name!r} is a reference policy, not learning settings to apply", "InvalidContract")
        return Response(status_code=204)

    # -- operations -----------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"}, 200)

    async def readyz(self, request: Request) -> Response:
        domains = {str(w): (loop.decider.policy_version or "baseline") for w, loop in list(self._loops.items())}
        if not self.ready:
            return _json({"status": "starting", "domains": domains}, 503)
        return _json({"status": "ready", "domains": domains}, 200)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), 200, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(self, request: Request) -> Response:
        version = request.query_params.get("api-version", V1)
        if version not in self._specs:
            return _error(api.bad("api-version", f"{version!r} is not served; use one of {', '.join(api.API_VERSIONS)}"), V1)
        return _json(self._specs[version], 200)


def _page(request: Request, items: list[Any], answer: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """A preview list's page: ``skip``, ``top`` (default: all) and ``maxpagesize`` (default
    100), with a ``nextLink`` to the rest."""
    query = request.query_params
    skip = _query_int(query, "skip", 0, 0)
    top = _query_int(query, "top", len(items), 0)
    page = _query_int(query, "maxpagesize", 100, 1)
    chosen = items[skip : skip + min(top, page)]
    body: dict[str, Any] = {"value": [answer(item) for item in chosen]}
    left = min(top, len(items) - skip) - len(chosen)
    if left > 0:
        body["nextLink"] = str(request.url.include_query_params(skip=skip + len(chosen), top=left, maxpagesize=page))
    return body


def _query_int(query, name: str, default: int, minimum: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise api.bad(name, f"{text!r} is not an integer") from None
    if value < minimum:
        raise api.bad(name, f"is {value}; it must be {minimum} or more")
    return value


def _check_api_version(request: Request) -> None:
    version = request.query_params.get("api-version")
    if version != PREVIEW:
        got = "missing" if version is None else repr(version)
        raise ApiError(f"api-version: {got}; this path serves api-version={PREVIEW} (v1.0 is under /personalizer/v1.0/)",
                       field="api-version")  # fmt: skip


def _json(body: Any, status: int) -> Response:
    return Response(json.dumps(body, separators=(",", ":"), allow_nan=False).encode(), status, media_type=_JSON)


def _error(error: ApiError, version: str) -> Response:
    status, body = api.error_body(error, version)
    response = JSONResponse(body, status)
    if version == PREVIEW:
        response.headers["x-ms-error-code"] = body["error"]["code"]
    if status == 401:
        response.headers["WWW-Authenticate"] = 'ApiKey header="Ocp-Apim-Subscription-Key"'
    return response


def _snapshot_blob(loop: DomainLoop):
    """The held snapshot's blob from the repository, checked against its signed length and hash."""
    client = loop.snapshot_client
    loaded = client.current if client is not None else None
    if loaded is None:
        raise ApiError(f"model: {loop.where} has no verified snapshot yet; the baseline decides", "not_found", field="model")
    target = loaded.target
    data = client.store.get(f"{client.prefix}/{target.blob_key}")
    if len(data) != target.length or hashlib.sha256(data).hexdigest() != target.sha256:
        raise ApiError(f"model: the repository's {target.path} no longer matches its signed hash", "internal")
    return data, loaded


def _oldest_record_ms(settings: Settings) -> int | None:
    """The oldest record's time on the decisions topic, or None when it holds none (or the
    broker does not answer within a few seconds)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic = settings.topics.decisions
    consumer = Consumer(settings.kafka.consumer_config(f"banditstream-serve-logs-{os.getpid()}", **{"enable.auto.commit": False}))
    try:
        metadata = consumer.list_topics(topic, timeout=5)
        partitions = metadata.topics.get(topic)
        if partitions is None or partitions.error is not None:
            return None
        waiting = set(partitions.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in waiting])
        oldest = math.inf
        deadline = time.monotonic() + 3.0
        while waiting and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(waiting) * 4, timeout=0.5):
                if message.error() is not None or message.partition() not in waiting:
                    continue
                waiting.discard(message.partition())
                consumer.pause([TopicPartition(topic, message.partition())])
                oldest = min(oldest, message.timestamp()[1])
        return None if oldest == math.inf else int(oldest)
    finally:
        consumer.close()


def run(settings: Settings, *, host: str | None = None, port: int | None = None) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's handling): ``banditstream serve``."""
    import uvicorn

    app = ServeApp(settings, freeze_gc=True).asgi()
    uvicorn.run(
        app, host=host or settings.serve.host, port=settings.serve.port if port is None else port, log_level="info",
        access_log=False, server_header=False, proxy_headers=False,
    )  # fmt: skip


_PAGE = ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>banditstream</title><link rel="icon" href="data:,">'
         "<style>body{{font-family:system-ui,sans-serif;margin:48px;color:#222}}input{{font-size:14px;padding:4px}}</style>"
         "</head><body><h1>banditstream</h1>{}</body></html>")


def _login_page(note: str) -> str:
    import html

    form = ('<form method="post" action="/dashboard/login"><label>Subscription key <input type="password" name="key" '
            'autocomplete="current-password" autofocus></label> <input type="submit" value="Open"></form>')
    return _PAGE.format((f"<p>{html.escape(note)}</p>" if note else "") + form)


def _message_page(text: str) -> str:
    import html

    return _PAGE.format(f"<p>{html.escape(text)}</p>")


_FAVICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#2f6db5"/>'
            b'<path d="M3 12h2V8H3zm4 0h2V4H7zm4 0h2V6h-2z" fill="#fff"/></svg>')


async def _favicon(request: Request) -> Response:
    """What a browser asks every page of the service for (an SVG: no console error for it)."""
    return Response(_FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})
