"""What staging one model call's evidence costs at 100K-token prompts: the prompt ids as a
JSON list and the request text whole in the payload (as before) and both as deltas on the
conversation's previous call (now: the ids packed), side by side in one run on PostgreSQL.

    .venv/bin/python bench/evidence_staging.py [--calls 12] [--prompt-tokens 100000] [--growth 0.035]

One synthetic agent session: the first prompt has --prompt-tokens ids, each next call's
prompt is the previous one plus --growth of the first (the answer and a new observation;
at 100K tokens ~96.5% of a prompt repeats the previous one, as measured on Claude Code
sessions), with a request text of ~3.6 characters a token. Each call is staged both ways (capture.interaction_stage with compact=False, then
compact=True; the order alternates per call), each through its own committed INSERT.
Figures per call: staging time (the INSERT included), staged bytes as stored (pg_column_size
of the payload and the packed prompt, after TOAST compression), as sent (the payload's
JSON text plus the packed bytes), the prompt ids' share of those (the JSON list, or the
packed bytes), and the publication time (rebuild, canonical JSON, upload,
read back). The published objects of the two ways are compared byte for byte (the id in
the payload aside). Prints figures, the last line one JSON object; asserts nothing. The
database (DATABASE_URL, default synth_bench_evidence) is created if missing and migrated;
objects go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth_bench_evidence")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
os.environ.setdefault("SYNTH_VAR_DIR", tempfile.mkdtemp(prefix="synth-bench-evidence-"))

WORDS = "the of file test run import def return self value error line path config model tool result".split()


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def text_of(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens * 3.6 / 5)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=100_000)
    parser.add_argument("--growth", type=float, default=0.035)
    args = parser.parse_args()

    ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from apps.accounts.services import org_get_or_create
    from apps.objects.selectors import object_get
    from apps.objects.services import object_read
    from apps.proxy import capture, prompt_store
    from apps.proxy.models import Interaction
    from apps.proxy.routes import route_upsert
    from synth_common.canonical import canonical_bytes

    org = org_get_or_create(slug="bench-evidence")
    route, _ = route_upsert(
        name="bench-evidence",
        family="qwen3",
        tokenizer="qwen3",
        context_window=1_000_000,
        max_output=4096,
        sampler_backend="instant",
        sampler_config={},
        aliases=[],
    )
    rng = random.Random(0)
    session = f"bench-{time.time_ns()}"
    prompt = [rng.randrange(152_000) for _ in range(args.prompt_tokens)]
    messages = [{"role": "user", "content": text_of(rng, args.prompt_tokens)}]
    figures: dict[str, dict[str, list[float]]] = {
        way: {"stage_ms": [], "stored": [], "sent": [], "prompt": [], "publish_ms": []} for way in ("before", "after")
    }
    identical = True
    depths: list[int] = []
    for index in range(args.calls):
        output = [rng.randrange(152_000) for _ in range(400)]
        rec = capture.CaptureRecord(
            org_id=org.id,
            principal_kind="attempt",
            credential_id="mcr_bench",
            token_id="",
            run_id="run_bench",
            trial_id="trl_bench",
            correlation_id="trl_bench",
            session_id=session,
            agent_id="",
            parent_agent_id="",
            request_id=f"req_{index}",
            route_id=route.id,
            route={"name": route.name, "family": route.family},
            model_requested="sonnet",
            stream=True,
            snapshot={"backend": "instant"},
            request={"messages": list(messages)},
            sampling={"max_tokens": 4096},
            fitting=[],
            original_prompt_tokens=len(prompt),
            prompt_ids=list(prompt),
            prompt_reused_ids=0,
            output_ids=output,
            logprobs=[-rng.random() * 4 for _ in output],
            finish="stop",
        )
        staged: dict[str, Interaction] = {}
        for way in ("before", "after") if index % 2 == 0 else ("after", "before"):
            started = time.perf_counter()
            staged[way] = capture.interaction_stage(rec=rec, compact=way == "after")  # autocommit
            figures[way]["stage_ms"].append((time.perf_counter() - started) * 1000)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_column_size(payload) + coalesce(pg_column_size(prompt_ids_packed), 0),"
                    " octet_length(payload::text) + coalesce(octet_length(prompt_ids_packed), 0),"
                    " coalesce(octet_length(prompt_ids_packed), octet_length((payload->'prompt_ids')::text))"
                    " FROM proxy_interaction WHERE id = %s",
                    [staged[way].id],
                )
                stored, sent, prompt_bytes = cursor.fetchone()
            figures[way]["stored"].append(stored)
            figures[way]["sent"].append(sent)
            figures[way]["prompt"].append(prompt_bytes)
        depths.append(Interaction.objects.get(pk=staged["after"].pk).prompt_depth or 0)
        published: dict[str, bytes] = {}
        for way, interaction in staged.items():
            started = time.perf_counter()
            capture.interaction_publish(interaction_id=interaction.id)
            figures[way]["publish_ms"].append((time.perf_counter() - started) * 1000)
            interaction.refresh_from_db()
            published[way] = object_read(obj=object_get(org=org, sha256=interaction.payload_sha256))
        after = json.loads(published["after"])
        identical = identical and canonical_bytes({**after, "id": staged["before"].id}) == published["before"]
        # The next call: this prompt, its answer, a new observation.
        grown = int(args.prompt_tokens * args.growth)
        prompt = prompt + output + [rng.randrange(152_000) for _ in range(max(0, grown - len(output)))]
        messages += [
            {"role": "assistant", "content": text_of(rng, len(output))},
            {"role": "user", "content": text_of(rng, grown - len(output))},
        ]

    summary: dict[str, float | int | bool] = {"calls": args.calls, "prompt_tokens": args.prompt_tokens}
    print(f"{args.calls} calls of one session: {args.prompt_tokens} prompt tokens, then {grown} more a call")
    print(
        f"{'':8} {'stage p50':>10} {'p99 ms':>8} {'stored KB':>10} {'sent KB':>9} {'ids KB':>8} {'publish p50 ms':>15}"
    )
    for way, f in figures.items():
        stage_p50, stage_p99 = pct(f["stage_ms"], 0.5), pct(f["stage_ms"], 0.99)
        stored, sent = statistics.mean(f["stored"]), statistics.mean(f["sent"])
        publish, prompt_bytes = pct(f["publish_ms"], 0.5), statistics.mean(f["prompt"])
        print(
            f"{way:8} {stage_p50:10.1f} {stage_p99:8.1f} {stored / 1024:10.1f} {sent / 1024:9.1f}"
            f" {prompt_bytes / 1024:8.1f} {publish:15.1f}"
        )
        summary |= {
            f"stage_ms_p50_{way}": round(stage_p50, 2),
            f"stage_ms_p99_{way}": round(stage_p99, 2),
            f"staged_bytes_per_call_{way}": round(stored),
            f"staged_sent_bytes_per_call_{way}": round(sent),
            f"staged_prompt_ids_bytes_per_call_{way}": round(prompt_bytes),
            f"publish_ms_p50_{way}": round(publish, 2),
        }
    summary["stage_ms_ratio"] = round(summary["stage_ms_p50_after"] / summary["stage_ms_p50_before"], 3)
    summary["staged_bytes_ratio"] = round(
        summary["staged_bytes_per_call_after"] / summary["staged_bytes_per_call_before"], 3
    )
    summary["max_delta_depth"] = max(depths)
    summary["snapshots"] = depths.count(0)
    summary["published_identical"] = identical
    print(
        f"after/before: staging {summary['stage_ms_ratio']:.2f}x, bytes {summary['staged_bytes_ratio']:.2f}x; "
        f"{summary['snapshots']} snapshots (chain bound {prompt_store.MAX_DEPTH}); "
        f"published objects identical: {identical}"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
