"""Cost scenarios: hold, dispatch, end-to-end drain, idle latency (fair vs plain)."""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

from kombu import Producer

from celery_fair.dispatcher import Dispatcher
from celery_fair.task import store_for

from .harness import (
    Bench,
    CpuMeter,
    captured_envelope,
    dispatching,
    emit,
    percentile,
    prefill,
    repeat,
    worker,
)


def hold(bench: Bench) -> dict[str, Any]:
    """``delay()`` of a fair task vs plain ``delay()``, tasks/s, no workers; and the CPU
    each costs (this process; the database server's for the fair one)."""
    n = bench.size(3000, 500, 100)

    def once() -> dict[str, float]:
        app = bench.app()
        rates, cpu = {}, {}
        for name, label in (("proj.plain", "plain"), ("proj.fair", "fair")):
            task = app.tasks[name]
            task.delay("warm")
            start = time.perf_counter()
            with CpuMeter(bench) as meter:
                for _ in range(n):
                    task.delay("acme")
            rates[label] = n / (time.perf_counter() - start)
            cpu.update(meter.per_task(n, label))
        bench.forget()
        cpu.pop("plain_db_cpu_ms_per_task", None)  # plain Celery never calls the store
        return {"plain_per_s": rates["plain"], "fair_per_s": rates["fair"],
                "ratio": rates["fair"] / rates["plain"], **cpu}

    figures = repeat(bench.reps, once)
    least = 0.8 if bench.sql else 0.9
    return emit("hold", figures, f"ratio >= {least}", figures["ratio"]["median"] >= least,
                bench)


def dispatch(bench: Bench) -> dict[str, Any]:
    """The dispatcher alone moving held tasks into the real queue: with the direct push
    (the default on a Redis broker that is the store's own Redis), with kombu's batched
    publish (``fair_direct_push = False``; the only way on a SQL store), and kombu
    publishing the same messages one by one (what plain Celery's publish costs). 10,000
    on a SQL store, whose fill (one transaction per hold) takes ~20x Redis's."""
    n = bench.size(10000 if bench.sql else 20000, 5000, 500)

    def once() -> dict[str, float]:
        figures: dict[str, float] = {}
        if not bench.sql:  # the CPU figures are the direct push's
            figures["fair_dispatches_per_s"], _, _, cpu = _dispatch_rate(bench, n, True)
        batched, envelope, queue, batch_cpu = _dispatch_rate(bench, n, False)
        if bench.sql:
            figures["fair_dispatches_per_s"], cpu = batched, batch_cpu
        else:
            figures["kombu_batch_dispatches_per_s"] = batched
        app = bench.app()
        with app.producer_or_acquire() as producer:
            figures["kombu_publish_per_s"] = _kombu_publish_rate(
                producer, envelope, queue + "-plain", n // 4)
        bench.drop_queue(app, queue + "-plain")
        bench.forget()
        return {**figures, **cpu}

    figures = repeat(bench.reps, once)
    least = 3000 if bench.sql else 10000
    return emit("dispatch", figures, f"fair_dispatches_per_s >= {least}",
                figures["fair_dispatches_per_s"]["median"] >= least, bench)


def _dispatch_rate(bench: Bench, n: int, direct: bool
                   ) -> tuple[float, Any, str, dict[str, float]]:
    """Dispatches/s of a dispatcher stepping through ``n`` held tasks in 100 groups, the
    envelope and queue it used, and its CPU per dispatch."""
    # No worker begins these tasks: a lease long enough that none runs out (the
    # dispatcher would dispatch it again, counting a dispatch twice, as on a slow run).
    app = bench.app(fair_max_inflight=10**9, fair_batch_size=500, fair_direct_push=direct,
                    fair_lease_seconds=3600)
    envelope = captured_envelope(app)
    queue = app.conf.task_default_queue
    prefill(store_for(app), queue, envelope, [f"g{i}" for i in range(100)], n // 100)
    dispatcher = Dispatcher(app)
    start = time.perf_counter()
    moved = 0
    with CpuMeter(bench) as meter:
        while moved < n:
            moved += dispatcher.step().dispatched
    elapsed = time.perf_counter() - start
    dispatcher.close()
    bench.drop_queue(app, queue)
    return n / elapsed, envelope, queue, meter.per_task(n, "dispatch")


def _kombu_publish_rate(producer: Producer, envelope: Any, queue: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        producer.publish(envelope.body, routing_key=queue, exchange="",
                         content_type=envelope.content_type,
                         content_encoding=envelope.content_encoding,
                         headers=envelope.headers, **envelope.properties)
    return n / (time.perf_counter() - start)


def end_to_end(bench: Bench) -> dict[str, Any]:
    """N no-op tasks drained by the same worker (threads, 8), fair vs plain.

    Only the drain is timed (worker start → last task started): the plain side is
    enqueued in one kombu publish batch and the fair side held through a pipeline, both
    before the worker starts, so the enqueue does not stretch the run. The CPU per task
    is the drain's: this process (worker) and the forked dispatcher, and the database
    server's; the broker's is left out (the same broker on both sides).
    """
    n = bench.size(bench.e2e_tasks, 2000, 150)
    tenants = [f"t{i}" for i in range(50)]

    def enqueue_plain(app: Any) -> None:
        task = app.tasks["proj.plain"]
        with app.producer_or_acquire() as producer, _batch(producer):
            for i in range(n):
                task.apply_async((tenants[i % 50],), ignore_result=True, producer=producer)

    def hold_fair(app: Any) -> None:
        envelope = captured_envelope(app)
        prefill(store_for(app), app.conf.task_default_queue, envelope, tenants, n // 50)

    def drain(fair: bool) -> tuple[float, dict[str, float]]:
        app = bench.app()
        (hold_fair if fair else enqueue_plain)(app)
        with CpuMeter(bench) as meter:
            with dispatching(app) if fair else nullcontext(), worker(app, concurrency=8):
                start = time.monotonic()
                end = bench.wait_done(app, n)
        bench.redis.flushdb()
        bench.forget()
        return n / (end - start), meter.per_task(n, "fair" if fair else "plain")

    def once() -> dict[str, float]:
        (plain, plain_cpu), (fair, fair_cpu) = drain(False), drain(True)
        plain_cpu.pop("plain_db_cpu_ms_per_task", None)
        return {"plain_per_s": plain, "fair_per_s": fair, "ratio": fair / plain,
                **plain_cpu, **fair_cpu}

    figures = repeat(bench.reps, once)
    least = 0.8 if bench.sql else 0.9
    return emit("end_to_end", {"tasks": n, **figures}, f"ratio >= {least}",
                figures["ratio"]["median"] >= least, bench)


def _batch(producer: Producer) -> Any:
    """kombu 5.7's publish batch where there is one (faster enqueue only)."""
    return producer.batch() if getattr(producer, "supports_batch_publish", False) \
        else nullcontext()


def idle_latency(bench: Bench) -> dict[str, Any]:
    """Enqueue → task start on an idle system; fair minus plain, in ms."""
    samples = 50 if bench.quick else 200

    def latencies(app: Any, name: str, count: int) -> list[float]:
        task = app.tasks[name]
        out = []
        base = bench.done(app)
        for i in range(count):
            sent = time.time()
            task.apply_async((f"t{i}",), ignore_result=True)
            bench.wait_done(app, base + i + 1)
            out.append((bench.starts(app)[-1][1] - sent) * 1000)
        return out

    def once() -> dict[str, float]:
        app = bench.app(fair_max_inflight=4)
        with worker(app, concurrency=4):
            latencies(app, "proj.plain", 3)  # warm connections
            plain = latencies(app, "proj.plain", samples)
        app = bench.app(fair_max_inflight=4)
        with dispatching(app), worker(app, concurrency=4):
            latencies(app, "proj.fair", 3)
            fair = latencies(app, "proj.fair", samples)
        return {"plain_p50_ms": percentile(plain, 50), "plain_p99_ms": percentile(plain, 99),
                "fair_p50_ms": percentile(fair, 50), "fair_p99_ms": percentile(fair, 99),
                "added_p50_ms": percentile(fair, 50) - percentile(plain, 50),
                "added_p99_ms": percentile(fair, 99) - percentile(plain, 99)}

    figures = repeat(bench.reps, once)
    met = figures["added_p50_ms"]["median"] <= 2 and figures["added_p99_ms"]["median"] <= 10
    return emit("idle_latency", figures, "added p50 <= 2 ms, p99 <= 10 ms", met, bench)
