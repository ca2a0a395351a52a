"""The asyncio client of `/v1/chat/completions` over one or more servers, with retries.

It imports neither torch nor transformers, so the client starts fast; httpx2's connection pool
is far cheaper than httpx 0.28's at tens of concurrent requests (dev/notes/regeneration.md), but still walks
all its connections per request, so each server's connections are spread over small pools.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from urllib.parse import urlsplit

try:  # the HTTP client the openai SDK (>= 3) is built on; its connection pool is far cheaper
    import httpx2 as httpx  # than httpx 0.28's at tens of concurrent requests (dev/notes/regeneration.md)
except ImportError:  # pragma: no cover - older openai releases
    import httpx
from draftlab.core.errors import InputError, RunFailure
from draftlab.regenerate.config import RETRY_STATUS, RegenConfig
from draftlab.regenerate.outputs import RunStats

# ------------------------------------------------------------------ servers and requests


class RequestFailed(Exception):
    """One request's failure. `unreachable`: no connection could be made (refused, connect timeout,
    unknown host), so the server is not there; the outage clock bounds those, not the row's retries."""

    def __init__(
        self,
        reason: str,
        retryable: bool,
        server_down: bool = False,
        retry_after: float | None = None,
        unreachable: bool = False,
        no_answer: bool = False,
    ):
        super().__init__(reason)
        self.reason, self.retryable, self.server_down = reason, retryable, server_down
        self.retry_after, self.unreachable, self.no_answer = retry_after, unreachable, no_answer


class ServerUnreachable(RunFailure):
    """No server could be reached: at the start (at once) or for longer than `max_outage`."""


API_SUFFIXES = ("/v1/chat/completions", "/chat/completions", "/v1")


def check_base_url(url: str) -> str:
    """The server's root URL (what requests append /v1/... to), or an InputError saying what is wrong.

    The forms users paste from a server's docs (`.../v1`, `.../v1/chat/completions`) are cut back to it."""
    example = "e.g. http://127.0.0.1:8000"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--base-url {url!r}: not an http(s) URL with a host, {example}")
    try:
        parts.port
    except ValueError:
        raise InputError(f"--base-url {url!r}: the port is not a number from 1 to 65535, {example}") from None
    if parts.query or parts.fragment:
        raise InputError(f"--base-url {url!r}: has a query or fragment; give the server's root URL, {example}")
    path = parts.path.rstrip("/")
    for suffix in API_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


class WrongEndpoint(InputError):
    """The server answers, but not to this URL or model (HTTP 404, 401, 403): every row would fail alike."""


class Endpoint:
    def __init__(self, url: str, capacity: int):
        self.url = url.rstrip("/")
        self.capacity = capacity
        self.in_flight = 0
        self.fails = 0  # consecutive connection-level failures
        self.down_until = 0.0  # monotonic time; 0 = in service
        self.probation = False  # back from a cooldown: one request at a time until one succeeds
        self.outages = 0
        self.ok = 0
        self.failed = 0
        self.unreachable_since: float | None = None  # monotonic; set by a failed connect, cleared by any answer
        self.last_answer = 0.0  # monotonic time of its last HTTP answer (any status)
        self.last_error = ""

    def limit(self, now: float) -> int:
        if self.down_until > now:
            return 0
        return 1 if self.probation else self.capacity


class ServerPool:
    """Spreads requests over base URLs with a slot limit each; a server that stops answering is
    taken out for a cooldown (doubling) and then tried again one request at a time."""

    def __init__(self, urls: list[str], config: RegenConfig):
        if not urls:
            raise InputError("at least one base URL is needed (--base-url URL)")
        self.endpoints = [Endpoint(u, config.concurrency) for u in urls]
        self.config = config
        self.cond = asyncio.Condition()
        self.retry_at = 0.0  # monotonic: the earliest retry a request is sleeping towards

    async def acquire(self) -> Endpoint:
        async with self.cond:
            while True:
                now = time.monotonic()
                free = [e for e in self.endpoints if e.in_flight < e.limit(now)]
                if free:
                    ep = min(free, key=lambda e: (e.in_flight / e.capacity, e.fails))
                    ep.in_flight += 1
                    return ep
                waits = [e.down_until - now for e in self.endpoints if e.down_until > now]
                try:  # a watcher (stage) cancels this wait when the outage lasts too long
                    await asyncio.wait_for(self.cond.wait(), timeout=min(waits) if waits else None)
                except asyncio.TimeoutError:
                    pass

    async def release(
        self,
        ep: Endpoint,
        ok: bool,
        server_down: bool = False,
        failure: RequestFailed | None = None,
        sent: float | None = None,
    ) -> None:
        """Return a slot. A connect that failed, or a request sent at `sent` that got no answer (dropped
        or timed out) while the server answered nothing else since, starts the outage clock."""
        async with self.cond:
            ep.in_flight -= 1
            if failure is not None and failure.no_answer and sent is not None and ep.last_answer < sent:
                failure.unreachable = True  # the server has said nothing since `sent`: an outage
                ep.unreachable_since = min(ep.unreachable_since or sent, sent)
                ep.last_error = failure.reason.split(" (")[0]
            elif failure is not None and failure.unreachable:
                ep.unreachable_since = ep.unreachable_since or time.monotonic()
                ep.last_error = failure.reason
            elif ok or (failure is not None and not failure.server_down and not failure.no_answer):
                ep.unreachable_since = None  # it answered (an HTTP error is an answer too)
                ep.last_answer = time.monotonic()
            if ok:
                ep.ok += 1
                ep.fails, ep.probation = 0, False
            else:
                ep.failed += 1
                if server_down and ep.down_until <= time.monotonic():  # not already out
                    ep.fails += 1
                    if ep.probation or ep.fails >= self.config.down_after:
                        ep.outages += 1
                        cool = min(120.0, self.config.server_cooldown * 2 ** (ep.outages - 1))
                        ep.down_until = time.monotonic() + cool
                        ep.probation = True
                        ep.fails = 0
            self.cond.notify_all()

    def outage(self, now: float | None = None) -> float | None:
        """Seconds since the last server became unreachable, or None while any one is not."""
        since = [e.unreachable_since for e in self.endpoints]
        if any(t is None for t in since):
            return None
        return (time.monotonic() if now is None else now) - max(since)

    def outage_message(self, now: float | None = None) -> str:
        """`server X unreachable for N s, retrying in M s`: what the progress line shows."""
        now = time.monotonic() if now is None else now
        down = ", ".join(e.url for e in self.endpoints)
        available = min(max(e.down_until, now) for e in self.endpoints)
        retry = max(available, self.retry_at) - now
        word = "server" if len(self.endpoints) == 1 else "servers"
        why = "; ".join(sorted({e.last_error for e in self.endpoints if e.last_error}))[:160]
        return f"{word} {down} not answering for {self.outage(now) or 0:.0f} s ({why}), retrying in {retry:.0f} s"

    def note_retry(self, at: float) -> None:
        now = time.monotonic()
        if self.retry_at <= now or at < self.retry_at:
            self.retry_at = at

    async def preflight(self, http: httpx.AsyncClient) -> None:
        """Fail at once when no server can be reached at all (a dead URL would otherwise mean a
        silent wait); any HTTP answer, even 404 or 401, counts as reachable."""
        reasons = []
        for ep in self.endpoints:
            try:
                wait = min(10.0, self.config.request_timeout)
                await http.get(f"{ep.url}/v1/models", timeout=httpx.Timeout(wait, connect=min(5.0, wait)))
                return
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                reasons.append(f"{ep.url} ({_short(exc)})")
                ep.unreachable_since, ep.last_error = time.monotonic(), _short(exc)
            except httpx.HTTPError:
                return  # connected: slow or odd, but there
        raise ServerUnreachable(f"no server answers at {', '.join(reasons)}; start it, or check --base-url")

    def stats(self) -> dict:
        return {e.url: {"ok": e.ok, "failed": e.failed, "outages": e.outages} for e in self.endpoints}


def _short(exc: BaseException) -> str:
    """An exception as a short phrase ('connection refused', 'connect timeout', ...)."""
    text = str(exc) or type(exc).__name__
    cause = exc
    while cause is not None:  # httpx says "All connection attempts failed"; the OS error says why
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(cause).lower():
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout"
    return text.split("] ")[-1][:120]


def parse_completion(resp: httpx.Response) -> dict:
    """text, finish reason and token counts of a /v1/chat/completions answer (or RequestFailed)."""
    try:
        body = resp.json()
        choice = body["choices"][0]
        text = choice["message"]["content"]
        finish = choice.get("finish_reason")
        usage = body.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RequestFailed(f"malformed response body ({type(exc).__name__}: {str(exc)[:120]})", retryable=True)
    if not isinstance(text, str):
        raise RequestFailed("malformed response body (message.content is not a string)", True)
    return {
        "text": text,
        "finish_reason": finish,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }


def reason_kind(reason: str) -> str:
    """A short category of an error reason, for counts (timeout, connection, HTTP 500, ...)."""
    body = reason.split(": ", 1)[1] if reason.startswith("turn ") else reason
    if body.startswith("HTTP "):
        return body.split(":")[0]
    for kind in ("empty answer", "timeout", "connection", "malformed"):
        if kind in body.split(" (")[0]:
            return kind
    return body[:40]


# Connections per httpx pool. A pool's bookkeeping walks all its connections twice per request, so
# one pool of 1,024 made the client CPU-bound far below what the server could take
# (figures in dev/LOG.md): each server's connections are spread over small pools instead.
POOL_CONNECTIONS = 16


class ChatClient:
    """Requests with timeouts, retries and exponential backoff over a ServerPool."""

    def __init__(self, pool: ServerPool, config: RegenConfig, stats: RunStats):
        self.pool, self.config, self.stats = pool, config, stats
        timeout = httpx.Timeout(config.request_timeout, connect=min(10.0, config.request_timeout))
        tls = httpx.create_ssl_context()  # one for all pools: building one is ~60 ms each

        def client(n: int) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                timeout=timeout, verify=tls, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)
            )

        self.http = client(4)  # the preflight's
        # per endpoint: [requests in flight, client]; a request takes the least loaded, so none of
        # the `capacity` requests the ServerPool lets through ever waits for a connection
        self.shards = {
            id(e): [[0, client(POOL_CONNECTIONS)] for _ in range(math.ceil((e.capacity + 4) / POOL_CONNECTIONS))]
            for e in pool.endpoints
        }

    async def aclose(self) -> None:
        for http in [self.http, *(c for shards in self.shards.values() for _, c in shards)]:
            await http.aclose()

    def body(self, messages: list[dict]) -> dict:
        c = self.config
        body = {
            "model": c.model,
            "messages": messages,
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "top_p": c.top_p,
        }
        if c.stop:
            body["stop"] = c.stop
        if c.seed is not None:
            body["seed"] = c.seed
        return body

    async def _once(self, ep: Endpoint, body: dict) -> dict:
        shard = min(self.shards[id(ep)], key=lambda sc: sc[0])
        shard[0] += 1
        try:
            resp = await shard[1].post(f"{ep.url}/v1/chat/completions", json=body)
        except httpx.ConnectError as exc:
            raise RequestFailed(f"connection refused or failed ({exc})", True, server_down=True, unreachable=True)
        except httpx.ConnectTimeout:
            raise RequestFailed("connect timeout", True, server_down=True, unreachable=True)
        except httpx.TimeoutException as exc:
            reason = f"no answer within --timeout {self.config.request_timeout:g} s ({type(exc).__name__})"
            raise RequestFailed(reason, True, no_answer=True)
        except httpx.TransportError as exc:  # dropped connection, incomplete body, ...
            reason = f"connection dropped without an answer ({type(exc).__name__}: {exc})"
            raise RequestFailed(reason, True, server_down=True, no_answer=True)
        finally:
            shard[0] -= 1
        if resp.status_code in (401, 403, 404):
            raise WrongEndpoint(
                f"--base-url {ep.url} / --model {self.config.model!r}: the server answered HTTP {resp.status_code} "
                f"to POST /v1/chat/completions ({resp.text[:120].strip()}); give the server's root URL "
                f"(e.g. http://127.0.0.1:8000), a model it serves, and a key if it wants one"
            )
        if resp.status_code != 200:
            retry_after = None
            if resp.status_code == 429:
                try:
                    retry_after = float(resp.headers.get("retry-after", ""))
                except ValueError:
                    pass
            return_text = resp.text[:200].replace("\n", " ")
            raise RequestFailed(
                f"HTTP {resp.status_code}: {return_text}",
                retryable=resp.status_code in RETRY_STATUS or resp.status_code >= 500,
                retry_after=retry_after,
            )
        return parse_completion(resp)

    async def complete(self, messages: list[dict]) -> tuple[dict, int]:
        """One assistant turn; returns (result with 'server', attempts) or raises RequestFailed.

        A failed connect is retried with backoff without using up `max_retries`: while no server
        is there, the run's outage clock (`max_outage`, the stage's watcher) decides when to stop."""
        body = self.body(messages)
        c = self.config
        attempt, tries, unreachable = 0, 0, 0
        while True:
            ep = await self.pool.acquire()
            self.stats.requests += 1
            tries += 1
            sent = time.monotonic()
            try:
                result = await self._once(ep, body)
            except RequestFailed as exc:
                await self.pool.release(ep, ok=False, server_down=exc.server_down, failure=exc, sent=sent)
                if exc.unreachable:
                    self.stats.retries += 1
                    unreachable += 1
                    delay = min(c.backoff_max, c.backoff_base * 2 ** min(unreachable, 16))
                    delay *= random.uniform(0.5, 1.0)
                    self.pool.note_retry(time.monotonic() + delay)
                    await asyncio.sleep(delay)
                    continue
                if not exc.retryable or attempt == c.max_retries:
                    exc.reason = f"{exc.reason} [server {ep.url}, attempt {attempt + 1}]"
                    raise
                self.stats.retries += 1
                delay = min(c.backoff_max, c.backoff_base * 2**attempt) * random.uniform(0.5, 1.0)
                if exc.retry_after is not None:
                    delay = min(c.backoff_max, max(delay, exc.retry_after))
                await asyncio.sleep(delay)
                attempt += 1
                continue
            except BaseException:
                await self.pool.release(ep, ok=False)
                raise
            await self.pool.release(ep, ok=True)
            result["server"] = ep.url
            return result, tries
