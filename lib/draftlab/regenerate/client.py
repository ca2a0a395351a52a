"""The asyncio client of `/v1/chat/completions` over one or more servers, with retries.

It imports neither torch nor transformers, so the client starts fast; httpx2's connection pool
is far cheaper than httpx 0.28's at tens of concurrent requests (notes/issue4.md).
"""

from __future__ import annotations

import asyncio
import random
import time

try:  # the HTTP client the openai SDK (>= 3) is built on; its connection pool is far cheaper
    import httpx2 as httpx  # than httpx 0.28's at tens of concurrent requests (notes/issue4.md)
except ImportError:  # pragma: no cover - older openai releases
    import httpx
from draftlab.regenerate.config import RETRY_STATUS, RegenConfig
from draftlab.regenerate.outputs import RunStats

# ------------------------------------------------------------------ servers and requests

class RequestFailed(Exception):
    def __init__(self, reason: str, retryable: bool, server_down: bool = False,
                 retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retryable, self.server_down = reason, retryable, server_down
        self.retry_after = retry_after


class Endpoint:
    def __init__(self, url: str, capacity: int):
        self.url = url.rstrip("/")
        self.capacity = capacity
        self.in_flight = 0
        self.fails = 0              # consecutive connection-level failures
        self.down_until = 0.0       # monotonic time; 0 = in service
        self.probation = False      # back from a cooldown: one request at a time until one succeeds
        self.outages = 0
        self.ok = 0
        self.failed = 0

    def limit(self, now: float) -> int:
        if self.down_until > now:
            return 0
        return 1 if self.probation else self.capacity


class ServerPool:
    """Spreads requests over base URLs with a slot limit each; a server that stops answering is
    taken out for a cooldown (doubling) and then tried again one request at a time."""

    def __init__(self, urls: list[str], config: RegenConfig):
        if not urls:
            raise ValueError("at least one base URL is needed")
        self.endpoints = [Endpoint(u, config.concurrency) for u in urls]
        self.config = config
        self.cond = asyncio.Condition()

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
                try:
                    await asyncio.wait_for(self.cond.wait(), timeout=min(waits) if waits else None)
                except asyncio.TimeoutError:
                    pass

    async def release(self, ep: Endpoint, ok: bool, server_down: bool = False) -> None:
        async with self.cond:
            ep.in_flight -= 1
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

    def stats(self) -> dict:
        return {e.url: {"ok": e.ok, "failed": e.failed, "outages": e.outages}
                for e in self.endpoints}


def parse_completion(resp: httpx.Response) -> dict:
    """text, finish reason and token counts of a /v1/chat/completions answer (or RequestFailed)."""
    try:
        body = resp.json()
        choice = body["choices"][0]
        text = choice["message"]["content"]
        finish = choice.get("finish_reason")
        usage = body.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RequestFailed(f"malformed response body ({type(exc).__name__}: {str(exc)[:120]})",
                            retryable=True)
    if not isinstance(text, str):
        raise RequestFailed("malformed response body (message.content is not a string)", True)
    return {"text": text, "finish_reason": finish, "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens")}


def reason_kind(reason: str) -> str:
    """A short category of an error reason, for counts (timeout, connection, HTTP 500, ...)."""
    body = reason.split(": ", 1)[1] if reason.startswith("turn ") else reason
    if body.startswith("HTTP "):
        return body.split(":")[0]
    for kind in ("timeout", "connection", "malformed"):
        if kind in body.split(" (")[0]:
            return kind
    return body[:40]


class ChatClient:
    """Requests with timeouts, retries and exponential backoff over a ServerPool."""

    def __init__(self, pool: ServerPool, config: RegenConfig, stats: RunStats):
        self.pool, self.config, self.stats = pool, config, stats
        n = sum(e.capacity for e in pool.endpoints)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout, connect=min(10.0, config.request_timeout)),
            limits=httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4))

    async def aclose(self) -> None:
        await self.http.aclose()

    def body(self, messages: list[dict]) -> dict:
        c = self.config
        body = {"model": c.model, "messages": messages, "max_tokens": c.max_tokens,
                "temperature": c.temperature, "top_p": c.top_p}
        if c.stop:
            body["stop"] = c.stop
        if c.seed is not None:
            body["seed"] = c.seed
        return body

    async def _once(self, ep: Endpoint, body: dict) -> dict:
        try:
            resp = await self.http.post(f"{ep.url}/v1/chat/completions", json=body)
        except httpx.ConnectError as exc:
            raise RequestFailed(f"connection refused or failed ({exc})", True, server_down=True)
        except httpx.ConnectTimeout:
            raise RequestFailed("connect timeout", True, server_down=True)
        except httpx.TimeoutException as exc:
            raise RequestFailed(f"timeout after {self.config.request_timeout:g} s "
                                f"({type(exc).__name__})", True)
        except httpx.TransportError as exc:  # dropped connection, incomplete body, ...
            raise RequestFailed(f"connection dropped ({type(exc).__name__}: {exc})", True,
                                server_down=True)
        if resp.status_code != 200:
            retry_after = None
            if resp.status_code == 429:
                try:
                    retry_after = float(resp.headers.get("retry-after", ""))
                except ValueError:
                    pass
            return_text = resp.text[:200].replace("\n", " ")
            raise RequestFailed(f"HTTP {resp.status_code}: {return_text}",
                                retryable=resp.status_code in RETRY_STATUS or resp.status_code >= 500,
                                retry_after=retry_after)
        return parse_completion(resp)

    async def complete(self, messages: list[dict]) -> tuple[dict, int]:
        """One assistant turn; returns (result with 'server', attempts) or raises RequestFailed."""
        body = self.body(messages)
        c = self.config
        for attempt in range(c.max_retries + 1):
            ep = await self.pool.acquire()
            self.stats.requests += 1
            try:
                result = await self._once(ep, body)
            except RequestFailed as exc:
                await self.pool.release(ep, ok=False, server_down=exc.server_down)
                if not exc.retryable or attempt == c.max_retries:
                    exc.reason = f"{exc.reason} [server {ep.url}, attempt {attempt + 1}]"
                    raise
                self.stats.retries += 1
                delay = min(c.backoff_max, c.backoff_base * 2 ** attempt) * random.uniform(0.5, 1.0)
                if exc.retry_after is not None:
                    delay = min(c.backoff_max, max(delay, exc.retry_after))
                await asyncio.sleep(delay)
                continue
            except BaseException:
                await self.pool.release(ep, ok=False)
                raise
            await self.pool.release(ep, ok=True)
            result["server"] = ep.url
            return result, attempt + 1
        raise AssertionError("unreachable")
