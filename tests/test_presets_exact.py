"""Every seed preset against its paper: the command line or job file the paper prints, read from the paper's own
text (shared/seeds, quoted there), must come out of the preset's preview token for token. Where a token cannot be the
paper's, the difference is listed here with its reason; nothing else may differ."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from campaigns import selectors, services
from campaigns.models import Campaign
from campaigns.presets import preset_get
from inventory.services import node_upsert, storage_upsert

pytestmark = pytest.mark.django_db

SEEDS = Path(__file__).resolve().parent.parent.parent / "shared" / "seeds"
if not SEEDS.is_dir():  # a worktree beside shared/ (/work/wt-x next to /work/shared)
    SEEDS = Path(__file__).resolve().parent.parent.parent.parent / "shared" / "seeds"
needs_seeds = pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed papers (shared/seeds) are not on this machine")


def seed_text(number: str) -> str:
    return next(SEEDS.glob(f"{number}_*.txt")).read_text()


def paper_mpirun(number: str) -> list[str]:
    """The paper's training command: from "mpirun \\" to the first --data_dir, continuation lines joined."""
    text = seed_text(number)
    start = text.index("mpirun \\", text.index("The command below was used to perform the ResNet-50 training"))
    joined = ""
    for line in text[start:].splitlines():
        line = line.strip()
        if line.startswith("--data_dir="):
            break
        if not line or line.startswith("```"):
            continue
        glued = joined.endswith("/")  # a path the paper wrapped after its "/" continues without a blank
        joined += ("" if glued or not joined else " ") + line.rstrip("\\").strip()
    return shlex.split(joined)


# Differences that cannot be the paper's, each with its reason.
SPELLINGS = {  # Open MPI reads these options with one dash or two; rackbench writes one spelling
    "--n": "-n",
    "-allow-run-as-root": "--allow-run-as-root",
    "-bind-to": "--bind-to",
    "-map-by": "--map-by",
    "obl": "ob1",  # seed 000 prints "-mca pml obl": Open MPI has no "obl" PML; seed 001 prints ob1
}


def normalised(argv: list[str]) -> tuple[list[str], set[str], str]:
    """(the command without its -x NAME=value pairs and host list, those pairs, the host list's slot counts).

    mpirun reads -x pairs in any order (rackbench writes them in name order, the campaign's env being a mapping),
    and the host names are the inventory's, not the paper's machines: their slot counts are compared instead."""
    out: list[str] = []
    env: set[str] = set()
    hosts = ""
    i = 0
    while i < len(argv):
        token = SPELLINGS.get(argv[i], argv[i])
        if token == "-x" and "=" in argv[i + 1]:
            env.add(argv[i + 1])
            i += 2
            continue
        if token == "--host":
            hosts = ",".join(h.rsplit(":", 1)[1] for h in argv[i + 1].split(",") if ":" in h)
            out.append(token)
            i += 2
            continue
        out.append(token)
        i += 1
    return out, env, hosts


def preview_mpirun(campaign: Campaign, **point: Any) -> list[str]:
    """The mpirun argv of the preview's primary host at the point with these parameters."""
    preview = selectors.campaign_preview(campaign=campaign, max_points=1000)
    found = next(p for p in preview["shown"] if all(p["params"].get(k) == v for k, v in point.items()))
    argv = shlex.split(found["hosts"][0]["command"].split(" && ", 1)[1])
    return argv[argv.index("mpirun") :]


def without_round_robin(argv: list[str]) -> list[str]:
    """rackbench's round-robin wrapper takes its directories before "--" and fills one --data_dir per rank
    (plugins/tools/round_robin_mpi.py); the paper's takes its 16 --data_dir flags after the program. The wrapper
    and the data flags are left out on both sides, so everything else must be equal."""
    if "./round_robin_mpi.py" not in argv:
        return argv
    at = argv.index("./round_robin_mpi.py")
    start = at - 1 if argv[at - 1] == "python3" else at
    rest = argv[argv.index("--", at) + 1 :] if "--" in argv[at:] else argv[at + 1 :]
    return [*argv[:start], "./round_robin_mpi.py", *[a for a in rest if not a.startswith("--data_dir=")]]


@pytest.fixture
def dgx() -> None:
    for i in range(1, 4):
        node_upsert(name=f"dgx2-{i}", address=f"10.0.0.{i}", tags=["dgx2"], gpu_count=16)
    for i in range(1, 31):
        node_upsert(name=f"dl-worker-{i:03}", address=f"10.1.0.{i}", tags=["gce"], gpu_count=4)
    storage_upsert(name="isilon", kind="nfs", data_addresses=["10.2.0.1"], export_path="/ifs")


@needs_seeds
@pytest.mark.parametrize(
    ("number", "slug", "tag", "point", "hosts"),
    [
        ("000", "seed000-tf-training", "dgx2", {"model": "resnet50", "nodes": 3}, "16,16,16"),
        ("001", "seed001-tf-training", "gce", {"nodes": 30}, ",".join(["4"] * 30)),
    ],
)
def test_the_training_preset_prints_the_papers_mpirun_command(
    dgx: None, number: str, slug: str, tag: str, point: dict[str, Any], hosts: str
) -> None:
    campaign = services.preset_instantiate(slug=slug, name=f"exact{number}", node_tags=[tag], storage="isilon")[0]
    paper, paper_env, paper_hosts = normalised(paper_mpirun(number))
    ours, our_env, our_hosts = normalised(without_round_robin(preview_mpirun(campaign, **point)))
    assert paper_hosts.startswith("16") or paper_hosts.startswith("4")  # the paper's own list, shortened with "..."
    assert our_hosts == hosts
    assert ours == without_round_robin(paper)
    assert our_env == paper_env


def paper_job_file(number: str) -> dict[str, set[str]]:
    """The paper's fio job file, section by section (its lines may span two code blocks, as seed 000's do)."""
    text = seed_text(number)
    body = text[text.index("[global]") : text.index("4. Run the FIO job")]
    return job_sections(body)


def job_sections(text: str) -> dict[str, set[str]]:
    """{section: its option lines}. fio reads a section's options in any order (and a campaign's parameters are a
    mapping, kept in no order by the database), so a section is compared as a set of lines; the directory list is
    the inventory's mount points, compared by how many it names."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("```", ";")):
            continue
        if line.startswith("["):
            current = line
            sections[current] = set()
        elif current:
            key, _, value = line.partition("=")
            sections[current].add(f"directory=<{len(value.split(':'))} mounts>" if key == "directory" else line)
    return sections


@needs_seeds
@pytest.mark.parametrize(
    ("number", "slug", "tag", "nodes"),
    [("000", "seed000-fio-storage", "dgx2", 3), ("001", "seed001-fio", "gce", 18)],
)
def test_the_fio_preset_writes_the_papers_job_file(dgx: None, number: str, slug: str, tag: str, nodes: int) -> None:
    (campaign,) = services.preset_instantiate(slug=slug, name=f"fio{number}", node_tags=[tag], storage="isilon")
    preview = selectors.campaign_preview(campaign=campaign, max_points=1000)
    point = next(p for p in preview["shown"] if p["params"]["nodes"] == nodes)
    primary = point["hosts"][0]
    job_files = {name: text for name, text in primary["files"].items() if name.endswith(".fio")}
    assert len(job_files) == nodes  # fio --client: one job file per client, each with its own mount points
    for text in job_files.values():
        assert job_sections(text) == paper_job_file(number)
    # The paper runs "fio --client=hosts fio1.job"; rackbench names each client with its job file (each client's
    # directories are its own mounts) and asks for JSON output, which it reads.
    argv = shlex.split(primary["command"].split(" && ", 1)[1])
    assert sum(a.startswith("--client=") for a in argv) == nodes
    assert all(h["service"].endswith("fio --server=ip:" + h["address"] + ",8765") for h in point["hosts"])


def paper_iperf_options(number: str) -> list[list[str]]:
    """Each client_opts="..." line of the paper's iPerf appendix, as tokens."""
    return [shlex.split(m) for m in re.findall(r'client_opts="([^"]*)"', seed_text(number))]


IPERF_SPELLINGS = {"--len": "-l", "--parallel": "-P", "--time": "-t"}  # iperf reads the long and short forms alike


@needs_seeds
def test_the_seed001_iperf_preset_passes_the_papers_client_options(dgx: None) -> None:
    """Appendix D.1: client_opts="-t 60 --len 65536 --parallel 32" (read) and "... --parallel 16" (write); figures
    4-7 vary the streams from 1 to 32. rackbench adds only what running many flows at once needs: -p (a port per
    flow), -B (the host's own address) and -f b (unrounded bits/s, which it reads)."""
    (campaign,) = services.preset_instantiate(slug="seed001-iperf", name="iperf001", node_tags=["gce"])
    preview = selectors.campaign_preview(campaign=campaign, max_points=1000)
    for options in paper_iperf_options("001"):
        wanted = [IPERF_SPELLINGS.get(t, t) for t in options]
        streams = int(wanted[wanted.index("-P") + 1])
        point = next(p for p in preview["shown"] if p["params"]["parallel"] == streams and p["params"]["nodes"] == 2)
        plan = json.loads(point["hosts"][0]["files"]["clients.json"])
        argv = plan["clients"][0]["argv"]
        ours = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i] in ("-t", "-l", "-P")}
        assert ours == dict(zip(wanted[::2], wanted[1::2], strict=True)), (options, argv)
        extra = [a for a in argv[3:] if a.startswith("-") and a not in ours]
        assert extra == ["-p", "-B", "-f"]  # rackbench's own, listed above


@needs_seeds
def test_the_seed003_mlperf_preset_keeps_the_papers_batch_per_system() -> None:
    """Seed 003: "a consistent batch size per system of 408 images as the workload is scaled": --batch-size is per
    GPU, so each 8-GPU DGX A100 gets 408 at 1, 2 and 4 nodes."""
    assert "consistent batch size per system of 408 images" in seed_text("003")
    for i in range(1, 5):
        node_upsert(name=f"a100-{i}", address=f"10.3.0.{i}", tags=["a100"], gpu_count=8)
    storage_upsert(name="aff", kind="nfs", data_addresses=["10.4.0.1"], export_path="/vol")
    (campaign,) = services.preset_instantiate(slug="seed003-ontap-mlperf", name="mlperf", node_tags=["a100"],
                                              storage="aff")  # fmt: skip
    for point in selectors.campaign_preview(campaign=campaign)["shown"]:
        argv = shlex.split(point["hosts"][0]["command"].split(" && ", 1)[1])
        ranks, batch = int(argv[argv.index("-n") + 1]), int(argv[argv.index("--batch-size") + 1])
        assert ranks == 8 * point["params"]["nodes"] and batch * 8 == 408


@needs_seeds
def test_the_seed000_iperf_preset_runs_the_appendixs_storage_network_test(dgx: None) -> None:
    """Seed 000's DGX-2 storage-network test: "seq 5001 5004 | xargs -P 0 -i iperf -t 900 -c 10.200.10.13 -p {} &"
    and the same for 5009-5012: 8 flows of 900 s. rackbench: one client, -t 900 -P 8 (its -p/-B/-f listed above)."""
    runs = re.findall(r"seq (\d+) (\d+) \| xargs -P 0 -i iperf -t (\d+) -c \S+ -p \{\}", seed_text("000"))
    flows = sum(int(b) - int(a) + 1 for a, b, _ in runs)
    seconds = {t for _, _, t in runs}
    (campaign,) = services.preset_instantiate(slug="seed000-iperf", name="iperf000", node_tags=["dgx2"])
    (point,) = selectors.campaign_preview(campaign=campaign)["shown"]
    argv = json.loads(point["hosts"][0]["files"]["clients.json"])["clients"][0]["argv"]
    assert (flows, seconds) == (8, {"900"})
    assert argv[argv.index("-t") + 1] == "900" and argv[argv.index("-P") + 1] == str(flows)


def paper_fio_parameters(number: str, part: str) -> set[str]:
    """Seed 003's "specific FIO configuration parameters" list as job-file lines for one configuration ("1024k
    for bandwidth test, 4k for IOPS test" gives the part's value), fio's long option names spelled short."""
    text = seed_text(number)
    start = text.index("specific FIO configuration parameters")
    lines = set()
    for key, value in re.findall(r"^- (\w+) = (.+)$", text[start : text.index("Figure 9", start)], re.M):
        chosen = [v.split(" for ")[0] for v in value.split(", ") if v.endswith(f"for {part} test")]
        lines.add(f"{FIO_SPELLINGS.get(key, key)}={chosen[0] if chosen else value.strip()}")
    return lines


FIO_SPELLINGS = {"blocksize": "bs"}  # fio reads either name; rackbench writes bs


@pytest.fixture
def a100() -> None:
    for i in range(1, 5):
        node_upsert(name=f"a100-{i}", address=f"10.3.0.{i}", tags=["a100"], gpu_count=8)
    storage_upsert(name="aff", kind="nfs", data_addresses=["10.4.0.1"], export_path="/vol")


@needs_seeds
@pytest.mark.parametrize("slug", ["seed003-ontap-fio", "seed003-ontap-validation"])
def test_the_seed003_fio_presets_write_the_papers_parameters(a100: None, slug: str) -> None:
    """Seed 003: ioengine, direct, blocksize, numjobs, iodepth and size as listed, for 100% reads and 100% writes on
    one, two and four DGX A100s. The job file adds only what a job file needs: where the data goes and the
    read/write mode ([global] directory, rw)."""
    campaigns = services.preset_instantiate(slug=slug, name=f"fio-{slug}", node_tags=["a100"], storage="aff")
    seen = set()
    for campaign in (c for c in campaigns if c.kind == "fio"):
        part = "IOPS" if campaign.fixed["numjobs"] == 180 else "bandwidth"
        preview = selectors.campaign_preview(campaign=campaign, max_points=1000)
        for point in preview["shown"]:
            assert len(point["hosts"]) == point["params"]["nodes"]
            for host in point["hosts"]:
                (text,) = (t for n, t in host["files"].items() if n.endswith(".fio"))
                lines = set().union(*job_sections(text).values())
                ours = {"directory=<1 mounts>", f"rw={point['params']['rw']}"}
                assert lines == paper_fio_parameters("003", part) | ours
            seen.add((part, point["params"]["rw"], point["params"]["nodes"]))
    assert {(p, n) for p, _, n in seen} == {(p, n) for p in ("bandwidth", "IOPS") for n in (1, 2, 4)}
    assert len(seen) == 12  # reads and writes of each


def paper_docker_run(number: str) -> list[str]:
    """The paper's container start ("ssh host \\ ... "/usr/sbin/sshd ; sleep infinity""), without "ssh host";
    seed 001's text has a page footer (a link) inside the command, left out."""
    text = seed_text(number)
    start = text.index("ssh host \\")
    body = text[start : text.index('"/usr/sbin/sshd ; sleep infinity"', start) + 33]
    lines = [line.strip().rstrip("\\").strip() for line in body.splitlines()]
    return shlex.split(" ".join(line for line in lines if line and not line.startswith("http")))[2:]


def docker_options(argv: list[str]) -> set[tuple[str, str]]:
    """A docker run's options as (flag, value) pairs ("--network=host" and "--network host" alike); the command,
    the container's name, the image and what follows it are compared apart."""
    run = argv.index("run")
    options: set[tuple[str, str]] = set()
    i = run + 1
    while i < len(argv) and argv[i].startswith("-"):
        flag, equals, value = argv[i].partition("=")
        if equals or flag in DOCKER_SWITCHES:
            options.add((flag, value))
            i += 1
        else:
            options.add((flag, argv[i + 1]))
            i += 2
    return options


DOCKER_SWITCHES = {"--rm", "--detach", "--privileged", "--init"}
# How rackbench's start differs from the papers', each with its reason:
DOCKER_DIFFERENCES = {
    ("--rm", ""),  # rackbench removes the container itself (docker rm -f before the start and at the end)
    ("--name", "tf"),  # each campaign's container has its own name
    ("--gpus", "all"),  # seed 000's nvidia-docker gives every GPU; docker 19.03+ says it with --gpus all
    ("--init", ""),  # a init process reaps the sshd sessions' children
    ("-v", "<keys>:/rackbench-keys:ro"),  # the campaign's ssh keys (the papers baked a key pair into the image)
    ("-e", "RACKBENCH_SSH_PORT=2222"),  # the image's entrypoint starts sshd on this port (the papers' sed)
}


@needs_seeds
@pytest.mark.parametrize(
    ("number", "slug"),
    [
        ("000", "seed000-tf-training"),
        ("000", "seed000-storage-read"),
        ("001", "seed001-tf-training"),
    ],
)
def test_the_training_presets_start_the_papers_container(dgx: None, number: str, slug: str) -> None:
    """Seeds 000 and 001 start one container per node with sshd on port 2222, from an image built FROM
    nvcr.io/nvidia/tensorflow:19.09-py3. rackbench's image is docker/bench-node built FROM the same NGC image (no
    key inside; its entrypoint runs sshd, where the papers' command ends with bash -c "/usr/sbin/sshd ; sleep
    infinity"); every option of the papers' docker run is in rackbench's, the differences listed above."""
    from plugins.containers import get_runtime, spec_from_dict

    tag = "dgx2" if number == "000" else "gce"
    for campaign in services.preset_instantiate(slug=slug, name=f"ctr{slug}", node_tags=[tag], storage="isilon"):
        spec = spec_from_dict(campaign.container)
        _, run = get_runtime(spec.runtime).start_argv(spec, name="tf", key_dir="/keys")
        ours = docker_options([a.replace("/keys:", "<keys>:") for a in run])
        paper = paper_docker_run(number)
        assert ours - DOCKER_DIFFERENCES == docker_options(paper) - DOCKER_DIFFERENCES
        assert paper[-3:] == ["bash", "-c", "/usr/sbin/sshd ; sleep infinity"]
        assert paper[-4] == "user/tensorflow:19.09-py3-custom" and "FROM nvcr.io/nvidia/tensorflow:19.09-py3" in (
            seed_text(number)
        )
        assert run[-1] == "rackbench/bench-node:tf-19.09" and spec.ssh_port == 2222
        assert campaign.fixed["mpi_ssh_port"] == 2222  # the papers' -mca plm_rsh_args "-p 2222"


@needs_seeds
def test_the_seed000_storage_read_preset_reads_the_papers_datasets_with_its_mpirun(dgx: None) -> None:
    """The paper prints no command for its TensorFlow Storage Benchmark: the preset reads the training runs'
    datasets (the 150x set of the printed --data_dir flags; the 148 GB set under /ifs/data/imagenet-scratch/
    tfrecords/train-*) and starts its ranks with the training runs' mpirun, less the NCCL variables."""
    text = seed_text("000")
    paper_150x = re.findall(r"--data_dir=/mnt/isilon\d+/(\S+?) ?\\?$", text, re.M)
    paper_148gb = re.findall(r"/ifs/(data/imagenet-scratch/tfrecords)/(train)-\d+-of-\d+", text)
    paper_mpi = normalised(paper_mpirun("000"))[0]
    paper_mpi = paper_mpi[: paper_mpi.index("./round_robin_mpi.py")]
    isilon, cache = services.preset_instantiate(slug="seed000-storage-read", name="sr", node_tags=["dgx2"],
                                                storage="isilon")  # fmt: skip
    assert {isilon.fixed["subdir"]} == set(paper_150x) and paper_150x  # isilon1, isilon2 ... isilon16
    assert {(cache.fixed["subdir"], cache.fixed["pattern"].rstrip("-*"))} == set(paper_148gb)
    for campaign in (isilon, cache):
        for point in selectors.campaign_preview(campaign=campaign)["shown"]:
            argv = shlex.split(point["hosts"][0]["command"].split(" && ", 1)[1])
            mpirun = argv[argv.index("mpirun") : argv.index("python3")]
            if "--preload-files" in mpirun:  # rackbench's: its reader scripts copied to the other nodes
                at = mpirun.index("--preload-files")
                mpirun = mpirun[:at] + mpirun[at + 2 :]
            ours = normalised(mpirun)
            ranks = 16 * point["params"]["nodes"]  # the paper's -n 48 is its 3 DGX-2s
            at = paper_mpi.index("-n") + 1
            wanted = [*paper_mpi[:at], str(ranks), *paper_mpi[at + 1 :]]
            assert ours == (wanted, set(), ",".join(["16"] * point["params"]["nodes"]))
            assert "--sync" in argv and argv[argv.index("--dir") + 1].endswith(campaign.fixed["subdir"])


def paper_table_flags(number: str) -> dict[str, list[str]]:
    """Seed 004's Table 1 as tf_cnn_benchmarks flags per model: {"resnet152": ["--batch_size=64", ...], ...}."""
    text = seed_text(number)
    table = text[text.index("\tRESNET152") : text.index("TABLE 1.")]
    models = [m.lower() for m in table.splitlines()[0].split()]
    flags: dict[str, list[str]] = {m: [] for m in models}
    for name, cells in re.findall(r"\((\w+)\)</b>((?:\t<b>\d+</b>)+)", table):
        for model, value in zip(models, re.findall(r"\d+", cells), strict=True):
            flags[model].append(f"--{name.lower()}={value}")
    return flags


@needs_seeds
@pytest.mark.parametrize("slug", ["seed004-roce-vs-tcp", "seed004-data-sources"])
def test_the_seed004_presets_pass_the_papers_table_and_nccl_variables(slug: str) -> None:
    """Seed 004 prints no command line; it prints Table 1 (batch size, batch_group_size, num_inter_threads per
    model), "100 training iterations" with distortions disabled, and NCCL_IB_DISABLE=1 with NCCL_SOCKET_IFNAME=bond0
    for TCP (RoCE being NCCL's default). Each point's command carries exactly those."""
    text = seed_text("004")
    table = paper_table_flags("004")
    tcp = {v.replace("\\_", "_") for v in re.findall(r"\*\*(NCCL[\\\w]+=\w+)\*\*", text)}
    assert "100 training iterations" in text and "distortions – image pre-processing steps – disabled" in text
    assert len(table) == 4 and all(len(flags) == 3 for flags in table.values()) and len(tcp) == 2
    for i in range(1, 5):
        node_upsert(name=f"dgx1-{i}", address=f"10.5.0.{i}", tags=["dgx1"], gpu_count=8)
    storage_upsert(name="flashblade", kind="nfs", data_addresses=["10.6.0.1"], export_path="/fb")
    seen = set()
    for campaign in services.preset_instantiate(slug=slug, name="s4", node_tags=["dgx1"], storage="flashblade"):
        for point in selectors.campaign_preview(campaign=campaign, max_points=1000)["shown"]:
            argv = preview_mpirun(campaign, **point["params"])
            program = argv[argv.index("-u") + 2 :]
            model = point["params"]["model"]
            assert [a for a in program if a.split("=")[0] in {f.split("=")[0] for f in table[model]}] == table[model]
            assert "--num_batches=100" in program and "--nodistortions" in program
            _, env, _ = normalised(argv)
            if point["params"].get("env.NCCL_IB_DISABLE") == 1:
                assert tcp <= env
            else:  # RoCE: NCCL's default (rackbench may spell NCCL_IB_DISABLE=0 out)
                assert not {e.split("=")[0] for e in env} & {"NCCL_SOCKET_IFNAME"} and "NCCL_IB_DISABLE=1" not in env
            seen.add(model)
    assert seen == set(table)


@needs_seeds
def test_the_seed002_presets_cover_what_the_paper_measures(dgx: None) -> None:
    """Seed 002 prints no fio option: its Figure 2 reads sequentially and randomly, buffered and direct, from a single
    thread ("single thread performance") to 80 threads ("when 80 threads are used"); Figure 3 the same reads by node.
    The presets sweep exactly that, and say that the rest is rackbench's."""
    text = seed_text("002")
    most = int(re.search(r"when (\d+) threads are used", text).group(1))  # type: ignore[union-attr]
    assert "single thread performance of sequential reads" in text and "buffered" in text and "Direct I/O" in text
    for slug in ("seed002-read-by-thread", "seed002-read-by-node"):
        (campaign,) = services.preset_instantiate(slug=slug, name=slug, node_tags=["gce"], storage="isilon")
        points = [p["params"] for p in selectors.campaign_preview(campaign=campaign, max_points=1000)["shown"]]
        assert {(p["rw"], p["direct"]) for p in points} == {(rw, d) for rw in ("read", "randread") for d in (0, 1)}
        assert "prints no command line" in preset_get(slug).description  # type: ignore[union-attr]
        if slug.endswith("thread"):
            assert {p["nodes"] for p in points} == {1}
            assert min(p["numjobs"] for p in points) == 1 and max(p["numjobs"] for p in points) == most


@needs_seeds
@pytest.mark.parametrize(
    "slug", ["seed003-ontap-fio", "seed003-ontap-mdtest", "seed003-ontap-nccl", "seed003-ontap-mlperf",
             "seed003-ontap-validation"],
)  # fmt: skip
def test_the_seed003_presets_use_the_papers_nodes_mounts_and_containers(a100: None, slug: str) -> None:
    """Seed 003 runs every test "with one, two, and four DGX A100 systems", mounts the FlexGroup with nConnect=8 and
    rsize/wsize 262144, and lists its containers in Table 2: mxnet:20.06-py3 for MLPerf, tensorflow:20.05-tf2-py3
    for the other tests (rackbench's images are docker/bench-node built FROM them, tagged after them)."""
    text = seed_text("003")
    assert "with one, two, and four DGX A100 systems" in text
    mount = {m.lower() for m in re.findall(r"(nConnect=\d+)|(rsize=\d+)|(wsize=\d+)", text) for m in m if m}
    containers = re.search(r"nvcr.io/nvidia/mxnet:(\S+) – Mlperf test tensorflow:(\S+) – other tests", text)
    assert mount == {"nconnect=8", "rsize=262144", "wsize=262144"} and containers
    for campaign in services.preset_instantiate(slug=slug, name="c3", node_tags=["a100"], storage="aff"):
        assert dict(campaign.matrix)["nodes"] == [1, 2, 4]
        if campaign.mounts:
            assert mount <= set(campaign.mounts["options"].split(","))
        framework, version = ("mxnet", containers[1]) if campaign.kind == "mlperf_resnet" else ("tf", containers[2])
        tag = version.removesuffix("-py3")
        assert campaign.container["image"] == f"rackbench/bench-node:{framework}-{tag}"
