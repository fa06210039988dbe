"""benchmarks/shards.py without measuring: its projection is arithmetic on a record, and --write-docs puts the
tables between the pages' markers. (The measurements themselves run on a Ray cluster, never in tests.)"""

from __future__ import annotations

import importlib.util
import math
import re
import sys

from paths import REPO


def _script():
    sys.path.insert(0, str(REPO / "benchmarks"))  # the script imports _records beside it
    spec = importlib.util.spec_from_file_location("shards_benchmark", REPO / "benchmarks" / "shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record() -> dict:
    ops = {
        "insert cartpole us_per_add": 500.0, "insert cartpole rows_per_s": 40_000.0,
        "insert atari us_per_add": 20_000.0, "insert atari rows_per_s": 2_000.0,
        "insert atari dedup us_per_add": 8_000.0, "insert atari dedup rows_per_s": 8_000.0,
        "dedup encode us_per_add": 4_000.0, "dedup decode us_per_add": 2_000.0, "dedup store us_per_add": 3_200.0,
        "sample cartpole us_per_batch": 4_000.0, "sample cartpole prioritized us_per_batch": 5_000.0,
        "sample atari us_per_batch": 64_000.0, "update async us_per_call": 300.0, "update sync us_per_call": 2_000.0,
        "limiter us_per_grant": 1_000.0, "limiter us_per_grant_pipelined": 250.0,
    }  # fmt: skip
    limiter = {"target": 2.0, "error_buffer": 2048.0, "min_size": 1000, "achieved": 1.98, "largest_deviation": 700.0,
               "blocked_inserts": 3, "blocked_samples": 40}  # fmt: skip
    return {
        "benchmark": "shards",
        "date": "2026-12-06T14:00:00Z",
        "config": {
            "rows": 64,
            "writers": 2,
            "worker_rate": 5_000,
            "worker_rate_atari": 1_000,
            "atari_envs": 8,
            "n_step": 3,
        },
        "medians": {
            "ops": ops,
            "learner": {"0 batches_per_s": 200.0, "2 batches_per_s": 120.0, "2 writer_rows_per_s": 30_000.0},
            "ingest": {"cartpole 1": 50_000.0, "atari 1": 2_500.0, "atari dedup 1": 6_000.0},
            "placement": {"1": [1]},
            "limiter": limiter,
            "row_bytes": {"cartpole": 66, "atari": 56_482, "atari dedup": 7_300.4},
            "wire_frames_per_row": 1.02,
        },
    }


def test_the_projection_is_the_arithmetic_of_the_record() -> None:
    shards = _script()
    text = shards.table([_record()])
    cells = [re.split(r"\s{2,}", line) for line in text.splitlines()]
    rows = {row[0]: row[1:] for row in cells if row[0].endswith(" workers")}
    # CartPole: 100 workers x 5,000 rows/s at 40,000 rows/s a shard; a grant per 64 rows at 4,000 grants/s (with
    # grants in flight);
    # the learner samples 200 x 256 rows/s
    inserted = 100 * 5_000
    cart = rows["CartPole, 100 workers"]
    assert cart == [
        f"{inserted:,}", f"{inserted * 66 / 1e6:,.0f}", f"{math.ceil(inserted / 40_000):,}",
        f"{inserted / 64 / 4_000:.2f}", f"{200 * 256 / inserted:.3g}",
    ]  # fmt: skip
    # Atari, 1,000 workers of 1,000 rows/s at 2,000 rows/s a shard; 256 rows per 64 ms sampled
    atari = rows["Atari, full rows, 1,000 workers"]
    assert atari == [f"{10**6:,}", f"{10**6 * 56_482 / 1e6:,.0f}", "500", f"{10**6 / 64 / 4_000:.2f}",
                         f"{256 / 0.064 / 10**6:.3g}"]  # fmt: skip
    # each frame once: the measured 7,300.5 bytes on the wire and 8,000 rows/s a shard, the rest as full rows
    dedup = rows["Atari, deduplicated, 1,000 workers"]
    assert dedup == [f"{10**6:,}", f"{10**6 * 7_300.4 / 1e6:,.0f}", "125", atari[3], atari[4]]
    assert rows["Atari, deduplicated, 100 workers"][1:3] == [f"{100_000 * 7_300.4 / 1e6:,.0f}", "13"]
    notes = " ".join(text.split("\n\n")[-1].split())
    assert "8,000 deduplicated Atari rows/s" in notes and "7,300 bytes per row on the wire" in notes
    assert "interpolated" not in notes
    # the operations and ingest tables show the three kinds of rows
    assert re.search(r"insert 64 Atari rows, each frame once \(FrameStorage\)\s+8,000\s+8,000", text)
    assert re.search(r"1 shard\(s\)\s+50,000\s+2,500\s+6,000\s+1", text)
    # where an add each frame once spends its time: us per 64-row add and the rows/s it allows
    assert re.search(r"each frame once: shard's FrameStorage insert \(in-process\)\s+3,200\s+20,000", text)


def test_write_docs_puts_the_tables_between_each_pages_markers_and_nothing_else(tmp_path) -> None:
    shards = _script()
    text = shards.table([_record()])
    for page, begin, end, _ in shards.PAGES:
        path = tmp_path / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"before\n\n{begin}\nold table\n{end}\n\nafter\n")
    shards.write_docs(text, str(tmp_path))
    shards.write_docs(text, str(tmp_path))  # twice: the same page
    blocks = text.split("\n\n")
    for page, begin, end, short in shards.PAGES:
        written = (tmp_path / page).read_text()
        assert written.startswith(f"before\n\n{begin}\n") and written.endswith(f"{end}\n\nafter\n")
        assert "old table" not in written
        shown = blocks[-2:] if short else blocks
        assert all(block in written for block in shown)
        assert short == (blocks[0] not in written)  # the README gets the projection alone
