"""The CI client (clients/rackbench_ci.py): its reports and exit codes, and its HTTP flow against a small real server.

The server here is a real ``http.server`` answering the API contract with recorded answers; the end-to-end test
against rackbench itself lives elsewhere. Nothing here touches the database.
"""

from __future__ import annotations

import json
import statistics
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from analysis import fleet as judged_fleet
from clients import rackbench_ci as ci
from clients.rackbench_ci import Policy, Tracked
from plugins.benchmarks.base import get_benchmark
from tests.test_fleet_devices import eight_gpus

URL = "https://rackbench.example"

# --- realistic verdicts -----------------------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, Any]:
    mean = statistics.mean(values)
    stdev = statistics.stdev(values)
    return {
        "n": len(values),
        "mean": mean,
        "stdev": stdev,
        "min": min(values),
        "max": max(values),
        "cv": stdev / mean * 100,
    }


def item(
    point: int,
    params: dict[str, Any],
    metric: str,
    unit: str,
    outcome: str,
    baseline: list[float],
    candidate: list[float],
    p_value: float | None,
    *,
    higher_is_better: bool = True,
) -> dict[str, Any]:
    b, c = stats(baseline), stats(candidate)
    change = (c["mean"] - b["mean"]) / b["mean"] * 100
    return {
        "point": point,
        "params": params,
        "metric": metric,
        "unit": unit,
        "higher_is_better": higher_is_better,
        "outcome": outcome,
        "change_pct": change,
        "baseline": b,
        "candidate": c,
        "p_value": p_value,
        "test": "welch-t",
        "reason": f"{metric} {b['mean']:.1f} -> {c['mean']:.1f} {unit} ({change:+.1f}%), p={p_value}",
    }


READ_1M = item(
    0, {"rw": "read", "bs": "1m"}, "bw_mbps", "MB/s", "pass", [3120.4, 3098.7, 3131.0], [3117.3, 3102.5, 3129.8], 0.91
)
RANDREAD_IOPS = item(
    1, {"rw": "randread", "bs": "4k"}, "iops", "IOPS", "regression", [412e3, 409e3, 415e3], [371e3, 368e3, 374e3], 3e-5
)
RANDREAD_P99 = item(
    1,
    {"rw": "randread", "bs": "4k"},
    "lat_p99_us",
    "us",
    "improvement",
    [182.0, 185.0, 179.0],
    [151.0, 149.0, 155.0],
    0.0008,
    higher_is_better=False,
)
WRITE_1M = item(
    2,
    {"rw": "write", "bs": "1m"},
    "bw_mbps",
    "MB/s",
    "inconclusive",
    [1480.0, 1702.0, 1390.0],
    [1420.0, 1301.0, 1655.0],
    0.42,
)


def verdict(
    *items: dict[str, Any], outcome: str | None = None, final: bool = True, campaign: int = 7
) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for i in items:
        counts[i["outcome"]] = counts.get(i["outcome"], 0) + 1
    worst = max((i["outcome"] for i in items), key=ci.OUTCOME_RANK.__getitem__, default="pass")
    return {
        "id": 31,
        "campaign": campaign,
        "baseline_campaign": {"id": 41, "name": "fio-nvme-baseline"},
        "outcome": outcome or worst,
        "method": "welch-t",
        "method_version": 1,
        "policy": {"threshold_pct": 5.0, "alpha": 0.05, "min_repetitions": 3},
        "final": final,
        "counts": counts,
        "created_at": "2025-03-04T10:11:12Z",
        "items": list(items),
    }


def judged(v: dict[str, Any], name: str = "fio-nvme-ci", cid: int = 7) -> Tracked:
    t = Tracked({"id": cid, "name": name, "status": "succeeded"}, verdict=v, done=True)
    t.started, t.ended = 100.0, 412.5
    return t


def errored(message: str = "campaign failed: 12/12 runs done, 3 failed", cid: int = 8) -> Tracked:
    t = Tracked({"id": cid, "name": "fio-nvme-ci-2", "status": "failed"})
    t.fail(message, "campaign-failed")
    return t


def no_baseline() -> Tracked:
    return Tracked({"id": 9, "name": "fio-new"}, no_baseline="no baseline for family fio-new", done=True)


def parse(tracked: list[Tracked], policy: Policy = Policy()) -> ET.Element:
    return ET.fromstring(ci.junit_xml(tracked, policy, URL))


# --- JUnit XML ------------------------------------------------------------------------------------------------------


def test_it_writes_one_testsuite_per_campaign_and_one_testcase_per_point_and_metric() -> None:
    root = parse([judged(verdict(READ_1M, RANDREAD_IOPS, RANDREAD_P99)), errored()])

    assert root.tag == "testsuites"
    assert [s.get("name") for s in root.findall("testsuite")] == ["fio-nvme-ci", "fio-nvme-ci-2"]
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("fio-nvme-ci.bw_mbps", "rw=read,bs=1m"),
        ("fio-nvme-ci.iops", "rw=randread,bs=4k"),
        ("fio-nvme-ci.lat_p99_us", "rw=randread,bs=4k"),
    ]
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "3",
        "failures": "1",
        "errors": "0",
        "skipped": "0",
        "time": "312.500",
    }
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "4",
        "failures": "1",
        "errors": "1",
        "skipped": "0",
    }
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["url"] == f"{URL}/campaigns/7/"
    assert props["baseline"] == "fio-nvme-baseline (#41)"


def test_it_reports_a_regression_as_a_failure_with_the_numbers() -> None:
    root = parse([judged(verdict(RANDREAD_IOPS))])

    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert failure.get("type") == "regression"
    assert failure.get("message") == RANDREAD_IOPS["reason"]
    text = failure.text or ""
    assert "-10.0%" in text
    assert "n=3 mean=412k IOPS" in text and "n=3 mean=371k IOPS" in text
    assert "p=3e-05 (welch-t)" in text
    assert "fio-nvme-baseline #41" in text


def test_it_skips_inconclusive_items_unless_told_to_fail_them() -> None:
    skipped = parse([judged(verdict(WRITE_1M))]).find("testsuite/testcase/skipped")
    failed = parse([judged(verdict(WRITE_1M))], Policy(fail_on_inconclusive=True)).find("testsuite/testcase/failure")

    assert skipped is not None and skipped.get("message") == WRITE_1M["reason"]
    assert failed is not None and failed.get("type") == "inconclusive"


def test_it_reports_a_failed_campaign_as_an_error_testcase() -> None:
    root = parse([errored()])

    case = root.find("testsuite/testcase")
    assert case is not None and case.get("name") == "campaign"
    error = case.find("error")
    assert error is not None
    assert error.get("type") == "campaign-failed"
    assert error.get("message") == "campaign failed: 12/12 runs done, 3 failed"


def test_it_skips_a_campaign_without_baseline_unless_one_is_required() -> None:
    skipped = parse([no_baseline()]).find("testsuite/testcase/skipped")
    error = parse([no_baseline()], Policy(require_baseline=True)).find("testsuite/testcase/error")

    assert skipped is not None and skipped.get("message") == "no baseline for family fio-new"
    assert error is not None and error.get("type") == "no-baseline"


def test_it_escapes_markup_and_replaces_characters_xml_cannot_carry() -> None:
    nasty = dict(RANDREAD_IOPS, params={"path": '/mnt/<nvme>&"x"'}, reason="iops fell \x1b[31m10%\x00 <below> & more")
    root = parse([judged(verdict(nasty), name='fio "a<b>&c"')])

    case = root.find("testsuite/testcase")
    assert case is not None
    assert case.get("classname") == 'fio "a<b>&c".iops'
    assert case.get("name") == 'path=/mnt/<nvme>&"x"'
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("message") == "iops fell \ufffd[31m10%\ufffd <below> & more"


# --- the summary ----------------------------------------------------------------------------------------------------


def test_it_prints_an_aligned_summary_table() -> None:
    lines = ci.summary_lines([judged(verdict(READ_1M, RANDREAD_IOPS, RANDREAD_P99, WRITE_1M))], Policy(), URL)

    table = lines[:5]
    assert table[0].split() == ["campaign", "point", "metric", "baseline", "candidate", "change", "p", "outcome"]
    assert table[2].split() == [
        "fio-nvme-ci",
        "rw=randread,bs=4k",
        "iops",
        "412k",
        "IOPS",
        "371k",
        "IOPS",
        "-10.0%",
        "<0.001",
        "regression",
    ]
    assert table[1].split()[3:] == ["3.12", "GB/s", "3.12", "GB/s", "-0.0%", "0.910", "pass"]
    # Text columns start where their header starts; numbers end where their header ends.
    outcome_at = table[0].index("outcome")
    change_end = table[0].index("change") + len("change")
    for line in table[1:]:
        assert line.rindex(line.split()[-1]) == outcome_at
        assert line.rindex("%") + 1 == change_end


def test_it_ends_the_summary_with_counts_outcome_and_link() -> None:
    lines = ci.summary_lines([judged(verdict(READ_1M, RANDREAD_IOPS, RANDREAD_P99))], Policy(), URL)

    assert lines[-2] == (
        "fio-nvme-ci: regression (1 pass, 1 improvement, 1 regression) against fio-nvme-baseline (#41), by the mean of "
        f"each side's repetitions  {URL}/campaigns/7/"
    )
    assert lines[-1] == "overall: regression (exit 1)"


def test_it_names_the_error_of_a_campaign_in_the_summary() -> None:
    lines = ci.summary_lines([judged(verdict(READ_1M)), errored()], Policy(), URL, table=False)

    assert lines == [
        f"fio-nvme-ci: pass (1 pass) against fio-nvme-baseline (#41), by the mean of each side's repetitions  "
        f"{URL}/campaigns/7/",
        f"fio-nvme-ci-2: error: campaign failed: 12/12 runs done, 3 failed  {URL}/campaigns/8/",
        "overall: error (exit 2)",
    ]


# --- exit codes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tracked", "policy", "code"),
    [
        (judged(verdict(READ_1M)), Policy(), 0),
        (judged(verdict(RANDREAD_P99)), Policy(), 0),
        (judged(verdict(WRITE_1M)), Policy(), 0),
        (judged(verdict(WRITE_1M)), Policy(fail_on_inconclusive=True), 1),
        (judged(verdict(READ_1M, RANDREAD_IOPS)), Policy(), 1),
        (judged(verdict(READ_1M, RANDREAD_IOPS, outcome="pass")), Policy(), 1),
        (no_baseline(), Policy(), 0),
        (no_baseline(), Policy(require_baseline=True), 2),
        (errored(), Policy(), 2),
    ],
    ids=[
        "pass",
        "improvement",
        "inconclusive",
        "inconclusive-fails",
        "regression",
        "item-regression",
        "no-baseline",
        "baseline-required",
        "campaign-failed",
    ],
)
def test_it_maps_each_outcome_and_flag_to_its_exit_code(tracked: Tracked, policy: Policy, code: int) -> None:
    assert ci.exit_code([tracked], policy) == code


def test_it_lets_an_error_win_over_a_regression() -> None:
    assert ci.exit_code([judged(verdict(RANDREAD_IOPS)), errored()], Policy()) == 2


# --- arguments ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"GITHUB_RUN_ID": "8812345", "GITHUB_RUN_ATTEMPT": "2", "CI_PIPELINE_ID": "1"}, "github-8812345-2"),
        ({"CI_PIPELINE_ID": "4411", "CI_JOB_ID": "99812"}, "gitlab-4411-99812"),
    ],
)
def test_it_derives_the_idempotency_key_from_ci_variables(env: dict[str, str], key: str) -> None:
    assert ci.default_idempotency_key(env) == key


def test_it_falls_back_on_a_random_idempotency_key() -> None:
    first, second = ci.default_idempotency_key({"GITHUB_RUN_ID": "1"}), ci.default_idempotency_key({})

    assert len(first) == 36 and first != second


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RACKBENCH_URL",
        "RACKBENCH_TOKEN",
        "GITHUB_RUN_ID",
        "GITHUB_RUN_ATTEMPT",
        "CI_PIPELINE_ID",
        "CI_JOB_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ci, "RETRY_DELAYS", (0.0, 0.0, 0.0))


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["run", "--token", "t", "--file", "c.yaml"], "no server: give --url or set RACKBENCH_URL"),
        (["run", "--url", URL, "--file", "c.yaml"], "no token: give --token or set RACKBENCH_TOKEN"),
        (["run", "--url", URL, "--token", "t"], "one of the arguments --file --preset is required"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--preset", "p"], "not allowed with argument"),
        (["run", "--url", URL, "--token", "t", "--preset", "fio-nvme"], "--preset needs --name"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--nodes", "a"], "--nodes apply to --preset only"),
        (["run", "--url", URL, "--token", "t", "--preset", "p", "--name", "n", "--family", "f"], "--file only"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--alpha", "1.5"], "not between 0 and 1"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--threshold", "-3"], "not a positive number"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--timeout", "soon"], "not a positive duration"),
        (["run", "--url", URL, "--token", "t", "--file", "c.yaml", "--baseline", "x"], "not a campaign id"),
        (["run", "--url", "rackbench:8000", "--token", "t", "--file", "c.yaml"], "must start with http"),
        (["launch"], "invalid choice"),
    ],
)
def test_it_rejects_bad_arguments_with_exit_2_and_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ci.main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith("rackbench-ci: error: ") and err.count("\n") == 1
    assert error in err


def test_it_reads_durations_in_seconds_minutes_or_hours() -> None:
    assert [ci._duration(t) for t in ("90", "2.5", "30m", "6h", "45s")] == [90, 2.5, 1800, 21600, 45]


def test_it_reports_an_unreadable_file_as_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ci.main(["run", "--url", URL, "--token", "t", "--file", str(tmp_path / "missing.yaml")]) == 2

    assert "missing.yaml: No such file or directory" in capsys.readouterr().err


# --- the HTTP flow, against a real server with recorded answers ---------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeApi:
    """Answers per (method, path), consumed in order; the last one repeats. Every request is recorded."""

    url: str = ""
    answers: dict[tuple[str, str], list[tuple[int, Any]]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)

    def on(self, method: str, path: str, *answers: tuple[int, Any]) -> None:
        self.answers[(method, path)] = list(answers)

    def answer(self, method: str, path: str) -> tuple[int, Any]:
        queue = self.answers.get((method, path))
        if not queue:
            return 404, {"message": "not found", "extra": {}}
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def sent(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if (r.method, r.path) == (method, path)]


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            fake.requests.append(
                Recorded(self.command, self.path, dict(self.headers), json.loads(raw) if raw else None)
            )
            status, body = fake.answer(self.command, self.path)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()
    thread.join()


YAML = "name: fio-nvme-ci\nkind: fio\nmatrix:\n  rw: [read, randread]\n  bs: [4k, 1m]\nrepetitions: 3\n"


def campaign(status: str, done: int = 0, failed: int = 0, cid: int = 7, name: str = "fio-nvme-ci") -> dict[str, Any]:
    return {
        "id": cid,
        "name": name,
        "kind": "fio",
        "status": status,
        "family": "fio-nvme",
        "run_total": 12,
        "run_done": done,
        "run_failed": failed,
    }


def serve_campaign(api: FakeApi, *states: dict[str, Any], cid: int = 7) -> None:
    api.on("POST", f"/api/v1/campaigns/{cid}/launch/", (200, dict(states[0], status="running")))
    api.on("GET", f"/api/v1/campaigns/{cid}/", *((200, s) for s in states))


def run(api: FakeApi, tmp_path: Path, *extra: str) -> int:
    spec = tmp_path / "campaign.yaml"
    spec.write_text(YAML)
    return ci.main(
        ["run", "--url", api.url, "--token", "s3cret", "--file", str(spec), "--poll-interval", "0.01", *extra]
    )


def test_it_creates_launches_follows_and_passes_a_campaign(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_RUN_ID", "8812345")
    monkeypatch.setenv("GITHUB_RUN_ATTEMPT", "1")
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(
        api, campaign("running", 3), campaign("running", 7, 1), campaign("running", 7, 1), campaign("succeeded", 12, 1)
    )
    api.on(
        "POST",
        "/api/v1/campaigns/7/launch/",
        (503, {"message": "unavailable", "extra": {}}),
        (200, campaign("running")),
    )
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(READ_1M, RANDREAD_P99)))
    junit = tmp_path / "rackbench.xml"

    code = run(api, tmp_path, "--family", "fio-nvme", "--junit", str(junit))

    out = capsys.readouterr().out
    assert code == 0
    assert {r.headers["Authorization"] for r in api.requests} == {"Bearer s3cret"}
    assert api.sent("POST", "/api/v1/campaigns/")[0].body == {"yaml": YAML, "family": "fio-nvme"}
    launches = api.sent("POST", "/api/v1/campaigns/7/launch/")
    assert [r.headers["Idempotency-Key"] for r in launches] == ["github-8812345-1-7"] * 2
    assert len(api.sent("GET", "/api/v1/campaigns/7/")) == 4
    assert api.sent("POST", "/api/v1/campaigns/7/verdict/")[0].body == {}
    assert "[fio-nvme-ci] 3/12 runs done, 0 failed (running)\n[fio-nvme-ci] 7/12 runs done, 1 failed (running)\n" in out
    assert out.count("7/12 runs done") == 1
    assert out.rstrip().endswith("overall: improvement (exit 0)")
    assert ET.parse(junit).getroot().get("tests") == "2"


def test_it_exits_1_on_a_regression_verdict(api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(READ_1M, RANDREAD_IOPS)))

    code = run(api, tmp_path, "--threshold", "3", "--alpha", "0.01", "--baseline", "41")

    assert code == 1
    body = api.sent("POST", "/api/v1/campaigns/7/verdict/")[0].body
    assert body == {"baseline": 41, "threshold_pct": 3.0, "alpha": 0.01}
    assert "412k IOPS" in capsys.readouterr().out


def test_it_exits_2_when_the_campaign_fails(api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("running", 4, 2), campaign("failed", 12, 5))

    code = run(api, tmp_path, "--junit", str(tmp_path / "r.xml"))

    assert code == 2
    assert api.sent("POST", "/api/v1/campaigns/7/verdict/") == []
    assert "fio-nvme-ci: campaign failed: 12/12 runs done, 5 failed" in capsys.readouterr().err
    assert ET.parse(tmp_path / "r.xml").getroot().get("errors") == "1"


def test_it_reads_the_verdict_stored_at_the_end_and_waits_through_a_rerun(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server judges a campaign as it ends, re-running a suspected regression while it still reads
    "running": the client waits, then reads that verdict instead of asking for a second one."""
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    rerun = dict(campaign("running", 12), run_total=15)
    serve_campaign(api, rerun, dict(campaign("succeeded", 15), run_total=15))
    api.on("GET", "/api/v1/campaigns/7/verdict/", (200, verdict(READ_1M)))

    code = run(api, tmp_path)

    assert code == 0
    assert api.sent("POST", "/api/v1/campaigns/7/verdict/") == []  # no second verdict stored
    assert "[fio-nvme-ci] 12/15 runs done, 0 failed (running)" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "code"), [((), 0), (("--require-baseline",), 2)])
def test_it_passes_without_baseline_unless_one_is_required(
    api: FakeApi, tmp_path: Path, flags: tuple[str, ...], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    no_baseline = {"message": "no baseline for family fio-nvme", "extra": {"reason": "no-baseline"}}
    api.on("POST", "/api/v1/campaigns/7/verdict/", (404, no_baseline))

    assert run(api, tmp_path, *flags) == code
    assert "fio-nvme-ci: no baseline: no baseline for family fio-nvme" in capsys.readouterr().out


def test_it_launches_and_judges_every_campaign_of_a_preset(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    intra, inter = campaign("draft", cid=11, name="nccl-ci-intra"), campaign("draft", cid=12, name="nccl-ci-inter")
    api.on("POST", "/api/v1/presets/nccl-allreduce/instantiate/", (201, {"campaigns": [intra, inter]}))
    serve_campaign(api, dict(intra, status="running", run_done=2), dict(intra, status="succeeded", run_done=12), cid=11)
    serve_campaign(api, dict(inter, status="succeeded", run_done=12), cid=12)
    api.on("POST", "/api/v1/campaigns/11/verdict/", (201, verdict(READ_1M, campaign=11)))
    api.on("POST", "/api/v1/campaigns/12/verdict/", (201, verdict(RANDREAD_IOPS, campaign=12)))
    junit = tmp_path / "r.xml"

    code = ci.main(
        ["run", "--url", api.url + "/", "--token", "t", "--preset", "nccl-allreduce", "--name", "nccl-ci"]
        + ["--nodes", "gpu1,gpu2", "--idempotency-key", "k", "--poll-interval", "0.01", "--junit", str(junit)]
    )

    assert code == 1
    assert api.sent("POST", "/api/v1/presets/nccl-allreduce/instantiate/")[0].body == {
        "name": "nccl-ci",
        "nodes": ["gpu1", "gpu2"],
        "node_tags": [],
    }
    assert api.sent("POST", "/api/v1/campaigns/11/launch/")[0].headers["Idempotency-Key"] == "k-11"
    assert api.sent("POST", "/api/v1/campaigns/12/launch/")[0].headers["Idempotency-Key"] == "k-12"
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [(s.get("name"), s.get("failures")) for s in suites] == [("nccl-ci-intra", "0"), ("nccl-ci-inter", "1")]
    assert f"{api.url}/campaigns/12/" in capsys.readouterr().out


def test_it_does_not_retry_a_refused_transition(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    refused = {"message": "campaign fio-nvme-ci is running", "extra": {"status": "running"}}
    api.on("POST", "/api/v1/campaigns/7/launch/", (409, refused))

    assert run(api, tmp_path) == 2
    assert len(api.sent("POST", "/api/v1/campaigns/7/launch/")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert 'HTTP 409: campaign fio-nvme-ci is running {"status": "running"}' in err


def test_it_reports_an_authentication_error_in_one_line(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (401, {"message": "Invalid token.", "extra": {}}))

    assert run(api, tmp_path, "--quiet") == 2
    err = capsys.readouterr().err
    assert err == (
        "rackbench-ci: error: POST /api/v1/campaigns/: HTTP 401: Invalid token. "
        "(check --token / RACKBENCH_TOKEN and the token's scope)\n"
    )


def test_it_refuses_a_campaign_created_in_another_family(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, dict(campaign("draft"), family="")))

    assert run(api, tmp_path, "--family", "fio-nvme") == 2
    assert api.sent("POST", "/api/v1/campaigns/7/launch/") == []
    assert "was created in family '', not 'fio-nvme'" in capsys.readouterr().err


def test_it_does_not_replay_a_create_after_a_gateway_timeout(api: FakeApi, tmp_path: Path) -> None:
    api.on("POST", "/api/v1/campaigns/", (504, {"message": "gateway timeout", "extra": {}}), (201, campaign("draft")))

    assert run(api, tmp_path) == 2
    assert len(api.sent("POST", "/api/v1/campaigns/")) == 1


def test_it_gives_up_after_the_timeout(api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("running", 1))

    assert run(api, tmp_path, "--timeout", "0.2", "--quiet") == 2
    assert "fio-nvme-ci: timed out after 0.2s waiting for it to end" in capsys.readouterr().err


def test_it_runs_as_a_management_command_with_the_clients_exit_code(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(RANDREAD_IOPS)))
    spec = tmp_path / "campaign.yaml"
    spec.write_text(YAML)
    argv = ["run", "--url", api.url, "--token", "t", "--file", str(spec), "--poll-interval", "0.01"]

    with pytest.raises(SystemExit) as exited:
        call_command("ci", *argv)

    assert exited.value.code == 1
    assert "overall: regression (exit 1)" in capsys.readouterr().out


def test_it_says_what_differs_when_the_baseline_is_another_configuration() -> None:
    item = {**READ_1M, "outcome": "inconclusive", "judged_outcome": "regression",
            "differences": ["fixed bs: 128k (baseline) vs 4k"]}  # fmt: skip
    lines = ci.summary_lines([judged(verdict(item))], Policy(), URL)
    assert any(line.startswith("fio-nvme-ci: inconclusive") and "not comparable: fixed bs: 128k (baseline) vs 4k"
               in line for line in lines)  # fmt: skip


def fleet(*outliers: tuple[str, float]) -> dict[str, Any]:
    """A fleet answer in the API's shape (analysis.fleet.fleet_payload): lab1..lab4, the given ones outliers."""
    bad = dict(outliers)
    return {
        "threshold": 3.5,
        "outliers": list(bad),
        "nodes": [
            {
                "node": f"lab{i}",
                "verdict": "outlier" if f"lab{i}" in bad else "ok",
                "evidence": [
                    {
                        "point": 0,
                        "metric": "throughput_bps",
                        "labels": "direction=send",
                        "parameters": "parallel=1",
                        "unit": "bit/s",
                        "value": 9.4e8 * bad[f"lab{i}"],
                        "fleet_median": 9.4e8,
                        "score": -13.9,
                        "samples": [2.8e8],
                    }  # fmt: skip
                ]
                if f"lab{i}" in bad
                else [],
            }
            for i in range(1, 5)
        ],
    }


def test_it_gives_a_node_level_verdict_and_fails_on_an_outlier_node(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(READ_1M, RANDREAD_P99)))
    api.on("GET", "/api/v1/campaigns/7/fleet/?threshold=3.5", (200, fleet(("lab3", 0.3))))

    code = run(api, tmp_path, "--fleet-threshold", "3.5")

    out = capsys.readouterr().out
    assert code == 1
    assert "nodes: 1 outlier: lab3 (throughput_bps at 30% of the fleet)" in out
    assert out.rstrip().endswith("overall: regression (exit 1)")


def test_a_healthy_fleet_passes_and_without_the_option_the_fleet_is_not_asked(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(READ_1M, RANDREAD_P99)))
    api.on("GET", "/api/v1/campaigns/7/fleet/?threshold=5", (200, fleet()))

    assert run(api, tmp_path, "--fleet-threshold", "5") == 0
    assert "nodes: none below the fleet" in capsys.readouterr().out
    assert run(api, tmp_path) == 0
    assert len([r for r in api.requests if "/fleet/" in r.path]) == 1


def test_its_numbers_read_as_on_the_pages() -> None:
    """The client carries a copy of common/numbers.py (it must stand alone): the two agree everywhere."""
    from common import numbers

    units = ["B/s", "MB/s", "MiB/s", "GB/s", "bit/s", "Mbit/s", "B", "MiB", "kB", "ns", "us", "ms", "s", "min",
             "MHz", "W", "%", "C", "IOPS", "ops/s", "img/s", "count", "ranks", "packets", "ratio", ""]  # fmt: skip
    for unit in units:
        for exponent in range(-10, 14):
            for mantissa in (1.0, 1.23456, 9.996, 99.97, 999.7):
                for value in (mantissa * 10.0**exponent, -mantissa * 10.0**exponent):
                    assert ci.quantity(value, unit) == numbers.quantity(value, unit), (value, unit)
        assert ci.quantity(0, unit) == numbers.quantity(0, unit)
    rows = ci._rows(judged(verdict(RANDREAD_IOPS)))
    assert rows[0][3:5] == ("412k IOPS", "371k IOPS")


# --- health suites ---------------------------------------------------------------------------------------------------


def suite_outcome(finished: bool, failed: str | None = None) -> dict[str, Any]:
    nodes = [
        {"node": f"lab{i}", "verdict": "healthy", "reasons": [], "evidence": []}
        for i in range(1, 5)
        if f"lab{i}" != failed
    ]
    if failed:
        evidence = [{"code": "step_failed:check", "detail": "exited with code 1: GPU 2: row remap pending"}]
        nodes.append({"node": failed, "verdict": "failed", "reasons": ["step_failed:check"], "evidence": evidence})
    counts = {"healthy": 4 - bool(failed), "suspect": 0, "failed": int(bool(failed))}
    return {"name": "ci-1", "finished": finished, "counts": counts, "nodes": nodes}


def test_a_suite_gates_on_its_verdict_per_node_and_acts_only_when_asked(
    api: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = {"name": "ci-1", "campaigns": [{"id": 7, "name": "ci-1-check"}]}
    api.on("POST", "/api/v1/suites/quick/run/", (201, launched))
    api.on("GET", "/api/v1/suite-runs/ci-1/", (200, suite_outcome(False)), (200, suite_outcome(True, "lab3")))
    action = {"node": "lab3", "action": "maintenance", "reason": "rackbench suite run ci-1"}
    api.on("POST", "/api/v1/suite-runs/ci-1/act/", (200, {"actions": [action]}))
    argv = ["suite", "quick", "--url", api.url, "--token", "s3cret", "--nodes", "lab1,lab2,lab3,lab4",
            "--name", "ci-1", "--poll-interval", "0.01"]  # fmt: skip

    assert ci.main(argv) == 1
    out = capsys.readouterr().out
    assert "lab3: failed (step_failed:check)" in out and "3 healthy, 0 suspect, 1 failed" in out
    assert api.sent("POST", "/api/v1/suites/quick/run/")[0].body == {
        "nodes": ["lab1", "lab2", "lab3", "lab4"], "name": "ci-1", "steps": []
    }  # fmt: skip
    assert not api.sent("POST", "/api/v1/suite-runs/ci-1/act/")

    assert ci.main([*argv, "--maintenance"]) == 1
    assert "lab3: maintenance" in capsys.readouterr().out
    assert api.sent("POST", "/api/v1/suite-runs/ci-1/act/")[0].body == {"maintenance": True, "slurm_login_node": ""}


def test_a_node_with_an_outlier_gpu_is_suspect_named_with_its_gpu_and_fails(
    api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fleet answer made as the server makes it (analysis.fleet) from the nvidia_smi parser's results of real
    dmon output, one GPU at a third of its siblings' clock."""
    column = judged_fleet.Column(0, "sm_clock_mhz", "", "", "MHz", True)
    samples: list[judged_fleet.DeviceSample] = []
    for node in ("lab1", "lab2", "lab3", "lab4"):
        for m in get_benchmark("nvidia_smi").parse(eight_gpus(slow=5 if node == "lab3" else None), host=node):
            if "gpu" in m.labels and m.name == column.name:
                samples.append((column, node, f"gpu{m.labels['gpu']}", [m.value]))
    answer = judged_fleet.devices_payload(judged_fleet.fleet_payload(judged_fleet.fleet_view([])),
                                          [judged_fleet.device_view("gpu", samples)])  # fmt: skip
    api.on("POST", "/api/v1/campaigns/", (201, campaign("draft")))
    serve_campaign(api, campaign("succeeded", 12))
    api.on("POST", "/api/v1/campaigns/7/verdict/", (201, verdict(READ_1M, RANDREAD_P99)))
    api.on("GET", "/api/v1/campaigns/7/fleet/?threshold=3.5", (200, answer))

    code = run(api, tmp_path, "--fleet-threshold", "3.5")

    out = capsys.readouterr().out
    assert code == 1
    assert "nodes: lab3 suspect: gpu5 sm_clock_mhz at 33% of the fleet's GPUs" in out
    assert out.rstrip().endswith("overall: regression (exit 1)")
