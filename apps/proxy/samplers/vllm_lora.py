"""Checkpoints' LoRA adapters served by a vLLM server, loaded into it at run time.

A checkpoint snapshot (``object:sha256:<hex>``) on an ``openai`` route is unpacked by the
proxy into the route's ``adapter_root``, a directory the server reads too
(apps.proxy.calls.sampler_config), and registered with the server under a name derived
from the package's digest:

    POST {base}/v1/load_lora_adapter   {"lora_name": "synth-<sha256>", "lora_path": <dir>}
    POST {base}/v1/completions         {"model": "synth-<sha256>", ...}
    POST {base}/v1/unload_lora_adapter {"lora_name": "synth-<sha256>"}

vLLM needs ``--enable-lora``, ``--max-lora-rank`` at least the trained rank, and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` for the two adapter endpoints.

``ServerAdapters`` (one per server sampler, i.e. per route configuration, in each proxy
process) keeps what this process has loaded there:

* an adapter is loaded once: concurrent first calls wait on one lock per adapter, and a
  server that answers "already loaded" (another proxy process, or this one before a
  restart, loaded it) counts as loaded;
* an adapter a sample in flight uses is never unloaded; one idle for ``idle_seconds`` is
  unloaded by a sweeper task, and before another is loaded the least recently used idle
  ones beyond ``max_loaded`` are unloaded;
* a sample the server answers with 404 (it restarted, or another process unloaded the
  adapter) reloads the adapter once and samples again;
* an adapter the server refuses to load is an ``AdapterLoadFailed``, which the proxy
  reports as an api_error naming the route and the snapshot.

All of this runs on the proxy's event loop; the state is rebuilt for a new loop (tests and
management commands run several), the server's own state being the authority.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from apps.proxy.samplers.factory import ModelNotServed

if TYPE_CHECKING:
    from apps.proxy.samplers.openai_compat import OpenAICompatibleSampler

logger = logging.getLogger(__name__)

LORA_PREFIX = "synth-"


def lora_name_for(*, sha256: str) -> str:
    """The name a package's adapter is served under: the same in every proxy process, so
    they share one registration on the server."""
    return f"{LORA_PREFIX}{sha256}"


class AdapterServer(Protocol):
    async def lora_load(self, *, name: str, path: str) -> None: ...

    async def lora_unload(self, *, name: str) -> None: ...


@dataclass
class _Loaded:
    generation: int  # bumped by every load: a 404 seen under an older one was already healed
    last_used: float
    in_use: int = 0


class ServerAdapters:
    def __init__(
        self,
        *,
        server: AdapterServer,
        idle_seconds: float,
        max_loaded: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_loaded < 1:
            raise ValueError("adapter_max_loaded must be at least 1")
        if idle_seconds < 0:
            raise ValueError("adapter_idle_seconds must not be negative")
        self.server = server
        self.idle_seconds = float(idle_seconds)
        self.max_loaded = int(max_loaded)
        self._clock = clock
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()  # least recently used first
        self._generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._unloading: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None

    # -- what a sample does ---------------------------------------------------------------

    async def acquire(self, *, name: str, path: str) -> int:
        """Mark ``name`` in use, loading it into the server first if this process has not.
        Returns the load generation (for ``reload``). Pair with ``release``."""
        self._bind_loop()
        async with self._lock(name):
            entry = self._loaded.get(name)
            if entry is None:
                pending = self._unloading.get(name)
                if pending is not None:  # a load racing its own unload would be undone by it
                    await asyncio.shield(pending)
                await self._make_room()
                await self.server.lora_load(name=name, path=path)
                entry = self._loaded[name] = _Loaded(generation=self._next_generation(), last_used=self._clock())
                logger.info("loaded LoRA adapter %s from %s", name, path)
            entry.in_use += 1
            entry.last_used = self._clock()
            self._loaded.move_to_end(name)
            generation = entry.generation
        self._sweep_soon()
        return generation

    async def reload(self, *, name: str, path: str, generation: int) -> int:
        """The server answered that it does not know ``name``: load it again, once for all
        the samples that saw the same loss. The caller holds ``name`` (acquired)."""
        async with self._lock(name):
            entry = self._loaded.get(name)
            if entry is None:  # not possible while acquired; be safe
                entry = self._loaded[name] = _Loaded(generation=-1, last_used=self._clock(), in_use=1)
            if entry.generation == generation:
                logger.warning("the server lost LoRA adapter %s; loading it again", name)
                await self.server.lora_load(name=name, path=path)
                entry.generation = self._next_generation()
            return entry.generation

    def release(self, *, name: str) -> None:
        entry = self._loaded.get(name)
        if entry is not None:
            entry.in_use = max(0, entry.in_use - 1)
            entry.last_used = self._clock()
        self._sweep_soon()

    # -- inspection (operators' logs, tests) ----------------------------------------------

    def loaded(self) -> list[str]:
        """Adapter names this process has loaded, least recently used first."""
        return list(self._loaded)

    def in_use(self, *, name: str) -> int:
        entry = self._loaded.get(name)
        return entry.in_use if entry is not None else 0

    # -- unloading ------------------------------------------------------------------------

    async def sweep(self) -> list[str]:
        """Unload the adapters idle for ``idle_seconds`` (and any beyond ``max_loaded``).
        Returns their names."""
        self._bind_loop()
        victims = self._victims(room_for=0)
        await self._unload(victims)
        return victims

    async def close(self) -> None:
        """Unload what no sample uses (a stopping proxy leaves nothing registered that no
        process would ever unload) and stop the sweeper."""
        if self._sweeper is not None and self._loop is asyncio.get_running_loop():
            self._sweeper.cancel()
        self._sweeper = None
        self._bind_loop()
        await self._unload([n for n, e in self._loaded.items() if e.in_use == 0 and not self._lock(n).locked()])

    def _victims(self, *, room_for: int) -> list[str]:
        now = self._clock()
        # Idle: no sample in flight and nobody acquiring it right now.
        idle = [n for n, e in self._loaded.items() if e.in_use == 0 and not self._lock(n).locked()]
        expired = {n for n in idle if now - self._loaded[n].last_used >= self.idle_seconds}
        excess = len(self._loaded) + room_for - self.max_loaded
        over = set(idle[: max(0, excess)])
        return [n for n in idle if n in expired or n in over]

    async def _make_room(self) -> None:
        await self._unload(self._victims(room_for=1))

    async def _unload(self, names: list[str]) -> None:
        tasks = []
        for name in names:
            # Forgotten first, synchronously: an acquire from now on loads it again (after
            # this unload has landed, see `_unloading`).
            self._loaded.pop(name, None)
            task = asyncio.get_running_loop().create_task(self._unload_one(name))
            self._unloading[name] = task
            task.add_done_callback(self._unloaded)
            tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks)

    def _unloaded(self, task: asyncio.Task[None]) -> None:
        for name, pending in list(self._unloading.items()):
            if pending is task:
                del self._unloading[name]

    async def _unload_one(self, name: str) -> None:
        try:
            await self.server.lora_unload(name=name)
            logger.info("unloaded LoRA adapter %s", name)
        except Exception as exc:  # noqa: BLE001 - the server may be gone; it forgets on restart
            logger.warning("could not unload LoRA adapter %s: %s", name, exc)

    def _sweep_soon(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            if not self._loaded:
                return
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        self._wake.set()

    async def _sweep_loop(self) -> None:
        while self._loaded:
            self._wake.clear()
            await self._unload(self._victims(room_for=0))
            if not self._loaded:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._next_expiry())
            except TimeoutError:
                pass

    def _next_expiry(self) -> float | None:
        """Seconds until the first idle adapter's idle time is up; None if every loaded one
        is in use (a release wakes the sweeper)."""
        now = self._clock()
        idle = [e.last_used for e in self._loaded.values() if e.in_use == 0]
        if not idle:
            return None
        return max(0.0, min(idle) + self.idle_seconds - now)

    # -- plumbing -------------------------------------------------------------------------

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Locks, events and tasks belong to one loop; what is loaded is the server's.
            self._loop = loop
            self._locks = {}
            self._unloading = {}
            self._wake = asyncio.Event()
            self._sweeper = None

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        if len(self._locks) > 4 * self.max_loaded + 64:  # forget the locks of long-gone adapters
            for other in [n for n, k in self._locks.items() if n not in self._loaded and not k.locked()]:
                if other != name:
                    del self._locks[other]
        return lock

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation


class AdapterSampler(Sampler):
    """Samples a checkpoint's adapter on a server sampler; owns no connection of its own
    (the factory may drop it at any time, the server sampler stays)."""

    def __init__(self, *, server: OpenAICompatibleSampler, name: str, path: str) -> None:
        self.server = server
        self.name = name
        self.path = path

    def snapshot(self) -> dict[str, Any]:
        return {**self.server.snapshot(), "model": self.name, "adapter": self.name, "lora_path": self.path}

    async def sample(self, request: SampleRequest) -> SampleResult:
        adapters = self.server.adapters
        generation = await adapters.acquire(name=self.name, path=self.path)
        try:
            try:
                return await self.server.sample_model(request, model=self.name, snapshot=self.snapshot())
            except ModelNotServed:
                await adapters.reload(name=self.name, path=self.path, generation=generation)
                return await self.server.sample_model(request, model=self.name, snapshot=self.snapshot())
        finally:
            # Also on cancellation (client disconnect): the adapter becomes idle again.
            adapters.release(name=self.name)
