"""Every way a job ends, told apart (injob/ends.py): the end class `status`, `diagnose` and the
record name, and what `rerun` does about it.

What cannot be made here (a GPU's ECC error or Xid, the OFI plugin's and oneCCL's failures, a
Lustre OST full) is printed by a fake trainer: a real local job whose lines are copied from real
logs in public issues (cited at each). The classes the live servers can make for real are
checked where those tests make them: the walltime, a hang and a cancel (test_slurm_cluster,
test_pbs_server), a lost node (test_failover), a setup line (test_software_check), the screen
and a straggler (test_screen), a full filesystem (below, a real tmpfs under Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.jobs import wait_state
from helpers.profiles import paced_spec, write_machine, write_spec

from mmm_orch.config.failures import common_failures, machine_failures
from mmm_orch.injob import ends, files
from mmm_orch.injob.diagnose import diagnose

# (what, lines after a first step, the class, the first signature); each line as the issue
# shows it.
RECORDED = {
    # jade-hpc-gpu/jade-hpc-gpu.github.io#194: one node's GPU, again and again (fixed by the site)
    "ecc": (["RuntimeError: CUDA error: uncorrectable ECC error encountered"], "node-lost",
            "gpu-hardware-fault"),
    # kohya-ss/sd-scripts#1434: 2x H100, the NCCL watchdog carrying the ECC error
    "ecc-nccl": (["[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with "
                  "exception: CUDA error: uncorrectable ECC error encountered"], "node-lost",
                 "gpu-hardware-fault"),
    # NVIDIA/open-gpu-kernel-modules#1151: the driver's Xid 79
    "xid79": (["NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."], "node-lost",
              "gpu-hardware-fault"),
    # aws/aws-ofi-nccl#663: 2x p5.48xlarge, aws-ofi-nccl 1.11.0, NCCL 2.20.5
    "ofi": (["[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/"
             "distributed/c10d/ProcessGroupNCCL.cpp:1970, internal error - please report this "
             "issue to the NCCL developers, NCCL version 2.20.5",
             "[rank1]: ncclInternalError: Internal check failed.",
             "[rank1]: Last error:",
             "[rank1]: NET/OFI Unable to insert remote address into address vector for device 1. "
             "RC: 0"], "crash", "nccl-error"),
    # databrickslabs/dolly#139: the disk full at epoch 0.3, in torch.save's zip writer
    "enospc": (["2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] "
                "[09c561ee-a44c-4795-967c-7183a83b3160]     zip_file.write_record(name, "
                "storage.data_ptr(), num_bytes)",
                "2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] "
                "[09c561ee-a44c-4795-967c-7183a83b3160] OSError: [Errno 28] No space left on "
                "device"], "disk-full", "filesystem-full"),
    # h2oai/h2o-llmstudio#214: the output volume full
    "stream-writer": (["RuntimeError: [enforce fail at inline_container.cc:471] . "
                       "PytorchStreamWriter failed writing file data/228: file write failed"],
                      "disk-full", "filesystem-full"),
    # wiki.lustre.org/Handling_Full_OSTs: one OST at 99% while the filesystem is at 46%
    "lustre-ost": (["dd: writing `/mnt/testfs/test_3': No space left on device"], "disk-full",
                   "filesystem-full"),
}


# A fake trainer: marks a first step as the trainers do (unless told --early), prints its lines
# (its arguments) on stderr and exits 1.
FAKE_TRAINER = """import sys, time
lines = sys.argv[1:]
if lines[:1] == ["--early"]:
    lines = lines[1:]
else:
    print(f"[mmm-orch] first_step={time.time():.3f} step=1 at=now", flush=True)
    print("step=3 loss=2.10", flush=True)
for line in lines:
    print(line, file=sys.stderr, flush=True)
sys.exit(1)
"""


def _fake_trainer(lines: list[str], first_step: bool = True) -> list[str]:
    path = Path("fake_trainer.py")
    path.write_text(FAKE_TRAINER)
    return ["--", sys.executable, str(path.resolve()), *([] if first_step else ["--early"]), *lines]


def _ended(cli, job: int) -> tuple[dict, dict]:
    row = wait_state(cli, job, timeout=120)
    found = cli("diagnose", str(job), "--json")
    assert found.code == 0, found.err
    return row, json.loads(found.out)


@pytest.mark.slow
def test_lines_from_real_failures_are_told_apart_by_status_diagnose_and_the_record(cli, isolated):
    write_spec(isolated, "mine", "name: mine\nresumable: true\n")
    ids = {}
    for what, (lines, _, _) in RECORDED.items():
        sent = cli("submit", "local", "mine", "--json", *_fake_trainer(lines))
        assert sent.code == 0, sent.err
        ids[what] = json.loads(sent.out)["id"]
    here = os.uname().nodename
    for what, (_, end_class, signature) in RECORDED.items():
        row, said = _ended(cli, ids[what])
        assert row["state"] == "failed" and row["end_class"] == end_class, (what, row)
        assert said["end"]["class"] == end_class and said["first"]["signature"] == signature, said
        if end_class == "node-lost":  # a line without a node's name: the job's node
            assert row["end_node"] == said["end"]["node"] == here, row
            assert said["end"]["rerun_avoids_node"]
        else:  # where it was seen, not a node to leave out
            assert not said["end"]["rerun_avoids_node"], said
        assert row["end_evidence"] == said["first"]["line"], (row, said)
    shown = cli("status", str(ids["ecc"]))
    assert f"node-lost {here}" in shown.out, shown.out
    told = cli("diagnose", str(ids["enospc"]))
    assert "ended: disk-full: a write failed for lack of room" in told.out, told.out
    assert "rerun: resumes from the run's latest checkpoint" in told.out, told.out


@pytest.mark.parametrize("machine,lines,before_step,end_class,signature", [
    # intel/intel-extension-for-pytorch#810: a PVC node, oneCCL finding no provider at init
    ("aurora", ["2025:05:23-19:04:20:(168952) |CCL_ERROR| atl_ofi_helper.cpp:1242 "
                "atl_ofi_prov_init: can't init provider psm3:autoselect_one:mlx5_0;mlx5_2",
                "2025:05:23-19:04:20:(168952) |CCL_ERROR| atl_ofi.cpp:237 init: can't find "
                "suitable provider"], True, "no-first-step", "oneccl-error"),
    # NVIDIA/nccl#1000: 2x DGX A100, FSDP, NCCL 2.18.5
    ("polaris", ["NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1331, "
                 "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
                 "2.18.5"], False, "crash", "nccl-error"),
    # aws/aws-ofi-nccl#715: the plugin's own line before NCCL's
    ("polaris", ["  | 2024-11-28T07:42:11.527Z | algo-1:17778:17848 [5] "
                 "nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI aws-ofi-nccl initialization "
                 "failed"], True, "no-first-step", "nccl-ofi-network"),
    # mila-iqia/milabench#397: an MI250 GPU's hardware exception
    ("frontier", [":0:rocdevice.cpp            :3586: 92087492418 us:  Callback: Queue "
                  "0x772c40900000 aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL "
                  "operation resulted in a hardware exception. code: 0x1016"], False,
     "node-lost", "gpu-hardware-fault"),
])
def test_the_facilities_own_lines_are_classed_with_their_profiles(machine, lines, before_step,
                                                                   end_class, signature):
    text = "\n".join(["[mmm-orch] job_start=1700000000 host=x4102c5s3b0n0 job=7", *lines])
    finding = diagnose(text, machine_failures(machine)).first
    assert finding.signature.name == signature
    end = ends.classify(ends.Facts("failed", first_step=not before_step, finding=finding))
    assert end.name == end_class
    assert end.node == "x4102c5s3b0n0"  # the only node the log names


def _retired(kind: str) -> files.RetiredNode:
    return files.RetiredNode("n2", f"n2 {kind}", False, 1, kind)


@pytest.mark.parametrize("facts,end_class,node", [
    (ends.Facts("completed"), "completed", ""),
    (ends.Facts("timeout", "resumable at step 12"), "walltime", ""),
    (ends.Facts("hung", "no step completed in 3s after step 1"), "hang", ""),
    (ends.Facts("hung", "no step", retired=(_retired(files.RETIRED_LOST),)), "hang", "n2"),
    (ends.Facts("cancelled", "stopped by SIGTERM"), "cancelled", ""),
    (ends.Facts("failed", why=files.WHY_SCREENED_OUT,
                screened_out=(files.ScreenedNode("n2", (1.0,), 0.1, None, True, "slow"),)),
     "screened-out", "n2"),
    (ends.Facts("completed",
                screened_out=(files.ScreenedNode("n2", (1.0,), 0.1, None, True, "slow"),)),
     "screened-out", "n2"),
    (ends.Facts("completed", retired=(_retired(files.RETIRED_STRAGGLER),)), "straggler-left", "n2"),
    (ends.Facts("failed", first_step=True, retired=(_retired(files.RETIRED_LOST),)),
     "node-lost", "n2"),
    # A blind rotation is a guess: not a node lost.
    (ends.Facts("failed", first_step=True,
                retired=(files.RetiredNode("n3", "blind rotation", True, 1, "node"),)), "crash", ""),
    (ends.Facts("failed", setup_failed="[mmm-orch] setup_failed: exit=1 line=module load x"),
     "setup-failed", ""),
    (ends.Facts("failed"), "no-first-step", ""),
    (ends.Facts("failed", first_step=True), "crash", ""),
])
def test_each_class_from_what_was_read(facts, end_class, node):
    end = ends.classify(facts)
    assert (end.name, end.node) == (end_class, node)


def test_every_class_says_what_a_rerun_does_and_the_signatures_point_only_at_classes():
    assert {c.rerun for c in ends.CLASSES} <= {ends.RESUME, ends.FRESH, ends.REFUSE}
    assert len(ends.BY_NAME) == len(ends.CLASSES) == 11
    for signature in machine_failures("aurora") + common_failures():
        assert signature.end in (None, *ends.LOG_CLASSES), signature.name


def test_a_profile_s_signature_pointing_at_no_class_is_refused(cli, isolated):
    write_machine(isolated, "odd", json.dumps({
        "extends": "local", "name": "odd",
        "failures": [{"name": "x", "pattern": "x", "end": "exploded"}]}))
    shown = cli("render", "odd", "--", "true")
    assert shown.code == 2 and "exploded" in shown.err and "node-lost" in shown.err, shown.err


@pytest.mark.slow
def test_rerun_does_what_the_class_calls_for(cli, isolated):
    """A crash after steps resumes (fresh where nothing was saved); a launch that never reached
    a step starts again; a failed setup line is refused whole unless told, and a lost node is
    left out."""
    write_spec(isolated, "mine", "name: mine\nresumable: true\n")
    write_machine(isolated, "lines", json.dumps(
        {"extends": "local", "name": "lines", "setup": ["export FIRST=1", "false"]}))
    crashed = json.loads(cli("submit", "local", "mine", "--json",
                             *_fake_trainer(["ValueError: bad batch"])).out)["id"]
    early = json.loads(cli("submit", "local", "mine", "--json",
                           *_fake_trainer(["ImportError: no x"], False)).out)["id"]
    setup = json.loads(cli("submit", "lines", "mine", "--json", "--", "true").out)["id"]
    lost = json.loads(cli("submit", "local", "mine", "--json",
                          *_fake_trainer(RECORDED["ecc"][0])).out)["id"]
    rows = {job: wait_state(cli, job, timeout=120) for job in (crashed, early, setup, lost)}
    assert [rows[j]["end_class"] for j in (crashed, early, setup, lost)] == [
        "crash", "no-first-step", "setup-failed", "node-lost"], rows

    def rerun(job: int, *how: str) -> dict:
        again = cli("rerun", str(job), *how, "--json")
        assert again.code == 0, again.err
        return _row(cli, json.loads(again.out)["id"])

    def args(job: dict) -> dict:
        return _plan(cli, job["id"])["launch"]["args"]

    assert {k: args(rerun(crashed)).get(k) for k in ("resume", "allow_fresh")} == {
        "resume": True, "allow_fresh": True}
    assert args(rerun(early)).get("resume") in (None, False)
    assert args(rerun(crashed, "--fresh")).get("resume") in (None, False)
    before = _count(cli)
    refused = cli("rerun", str(setup))
    assert refused.code == 2 and "setup-failed" in refused.err and "--fresh" in refused.err
    assert len(refused.err.strip().splitlines()) == 1, refused.err
    assert _count(cli) == before  # nothing recorded
    assert rerun(setup, "--fresh")["rerun_of"] == setup
    said = cli("rerun", str(lost))
    assert said.code == 0 and f"(node-lost), resuming from its run's latest checkpoint, avoiding " \
        f"{os.uname().nodename}" in said.out, said.out


def _row(cli, job: int) -> dict:
    shown = cli("status", "--json", str(job))
    assert shown.code == 0, shown.err
    return json.loads(shown.out)[0]


def _count(cli) -> int:
    shown = cli("status", "--json", "--all")
    assert shown.code == 0, shown.err
    return len(json.loads(shown.out))


def _plan(cli, job: int) -> dict:
    shown = cli("show", str(job), "--json")
    assert shown.code == 0, shown.err
    return json.loads(shown.out)["plan"]


# -- a full filesystem, for real ------------------------------------------------------------------

@pytest.mark.live
def test_a_run_on_a_full_filesystem_ends_disk_full_and_its_rerun_waits_for_room(
        cli, isolated, tmpfs, slurm_cluster, leftovers_cancelled):
    """The run's directory on a 1 MiB tmpfs: the first checkpoint fills it (a real ENOSPC), the
    job ends disk-full; its rerun is refused while the filesystem has no room for a checkpoint,
    and once it has, the rerun goes on (from the start: nothing was saved) to the end."""
    full = tmpfs("runs", "size=1m")
    write_spec(isolated, "fills", paced_spec("fills", "checkpoint_every: 2, steps: 6", step_s=0.05))
    sent = cli("submit", "slurm-local", "fills", "--set", f"output_dir={full}", "--json")
    assert sent.code == 0, sent.err
    job = json.loads(sent.out)["id"]
    row, said = _ended(cli, job)
    log = cli("logs", str(job)).out
    assert (row["state"], row["end_class"]) == ("failed", "disk-full"), log[-3000:]
    assert said["first"]["signature"] == "filesystem-full" and "No space left on device" in \
        said["first"]["line"], said
    assert "disk-full" in cli("status", str(job)).out

    refused = cli("rerun", str(job))
    assert refused.code == 2 and "filesystem has" in refused.err and "MiB free" in refused.err, \
        refused.err
    assert _count(cli) == 1  # nothing recorded
    subprocess.run(["mount", "-o", "remount,size=64m", str(full)], check=True)
    again = cli("rerun", str(job), "--json")
    assert again.code == 0, again.err
    done = wait_state(cli, json.loads(again.out)["id"], timeout=300)
    assert done["state"] == "completed", cli("logs", str(done["id"])).out[-3000:]
