"""The end-to-end demo (``make demo``): the host scheduler and model against simulated FPGAs.

The scripted scenario runs the numpy model on the host and its attention, token memory, hash
engine, directory, allocator, DMA and storage in the gateware — ``RingKVTop`` built with
Verilator, reached over a TCP socket through the same :class:`~ringkv.host.device.link.Link` that
opens ``/dev/ttyUSB0`` on the board — and storage in an image file:

1. three interleaved sessions (first requests: run and store);
2. a session resumed after others (query → hit → import by DMA);
3. a session whose snapshot the allocator evicted (query → miss → recompute by chunked prefill);
4. a power cut (the simulator process is killed), a restart on the same image, the device
   recovering its directory from the record headers by itself, and a resume (hit);
5. a session moved to a second simulated device by copying its record to that device's image
   (its recovery finds it, hit);
6. a conversation several times longer than the window, resumed by a constant-size import;
7. three conversations behind one shared system prompt: the first marks the prompt's end as a
   checkpoint (the scheduler stops its prefill there and exports the rings), the others find
   it as their longest stored prefix (``QUERY_PREFIX``), import it and compute only their own
   question;
8. an edit-and-resend: a conversation edits its first question (``rewind`` to the end of the
   system prompt) and resumes from the shared checkpoint.

Each request prints its path, the tokens it reused (imported) and computed (prefilled), and
of those the tokens the session had computed before (recomputed).

Every generated token is checked against a software-only run: the same model with the
attention core's bit-exact golden model (:class:`~ringkv.host.model.FixedBackend`) and no
scheduling or reuse at all; and every decision (path, tokens reused) against the same scenario
on the software device (:func:`software_run`: the device of ``ringkv demo --software``).

``board="ulx3s-85f"`` (``make demo-board``) runs the same scenario against the pin-level
simulation of the board top (:mod:`ringkv.sim.board_harness`: UART pins at 3 Mbaud, SD pins
on the bit-level card model) instead of the byte-stream top.

``sdram`` (``ringkv demo --sdram [PART]``): the devices have the SDRAM hot tier
(``RingKVTop(tier={"part": PART})``, a build of its own; the software device's twin models the
same tier, its SDRAM lost at the power cut as the simulator's), and the run ends with the
tier's residents, which must equal the software device's.

``config`` chooses the device (default :data:`~ringkv.defs.config.DEMO_CONFIG`); with
``numerics="ringkv-fx2"`` the same scenario runs on a top built with the int16 attention core
(``ringkv demo --numerics ringkv-fx2``).
"""

import random
import shutil
import tempfile
import time
from pathlib import Path

from ringkv.defs.config import DEMO_CONFIG
from ringkv.defs.record import RecordLayout
from ringkv.host.device.fpga import FpgaDevice
from ringkv.host.device.link import Link
from ringkv.host.model.transformer import (
    BOS,
    FixedBackend,
    Model,
    encode_text,
    show_text,
    weights_path,
)
from ringkv.host.scheduler import Scheduler, event_notes, path_summary, plain_run

__all__ = ["run_system_demo", "scenario", "short_scenario", "SCENARIO", "software_run",
           "SYSTEM_PROMPT"]

LANES = 4
MACS = 8
REGIONS = 2          # a small store, so that the allocator must evict


def _text(rng, n):
    words = ["ring", "window", "session", "cache", "token", "snapshot", "fpga", "host"]
    return encode_text(" ".join(rng.choice(words) for _ in range(n)) + ". ")


#: The system prompt shared by the demo's assistant conversations.
SYSTEM_PROMPT = "You are the ring scribe: answer from the window, briefly. "


def _shared_prompt_steps(rng, device="B", users=("dave", "erin", "frank"), n_new=6):
    """Conversations behind one system prompt (each marks the prompt's end as a checkpoint;
    only the first one computes it), then the last one edits its question."""
    system = [BOS] + encode_text(SYSTEM_PROMPT)
    mark = {"checkpoints": (len(system),)}
    steps = [("shared system prompt" if i == 0 else "", device, user,
              system + _text(rng, 2 + i % 2), n_new, mark) for i, user in enumerate(users)]
    steps.append((f"edit {users[-1]}'s question", device, users[-1], _text(rng, 3), n_new,
                  {"rewind": len(system)}))
    return steps


def scenario(seed=0):
    """``[(label, device, session, tokens, n_new[, options])]`` (``options``: the keyword
    arguments of :meth:`~ringkv.host.scheduler.Scheduler.request`); an action has session
    ``None`` and names itself in ``label``: ``"power cut"`` or ``"move <session>"`` (to
    device B)."""
    rng = random.Random(seed)
    return [
        ("three interleaved sessions", "A", "alice", [BOS] + _text(rng, 6), 6),
        ("", "A", "bob", [BOS] + _text(rng, 4), 6),
        ("resume after others", "A", "alice", _text(rng, 3), 6),
        ("", "A", "carol", [BOS] + _text(rng, 4), 6),
        ("evicted snapshot", "A", "bob", _text(rng, 2), 6),
        ("power cut", "A", None, None, None),
        ("resume after the power cycle", "A", "carol", _text(rng, 3), 6),
        ("move carol", "B", None, None, None),
        ("resume on device B", "B", "carol", _text(rng, 2), 6),
        ("long conversation", "B", "carol", _text(rng, 12), 8),
        ("", "B", "carol", _text(rng, 12), 8),
        ("", "B", "alice", _text(rng, 2), 4),
        ("resume the long one", "B", "carol", _text(rng, 3), 8),
    ] + _shared_prompt_steps(rng)


def short_scenario(seed=1):
    """The shorter end-to-end run of ``make test``: every path, a power cut, a move, a shared
    system prompt and an edit."""
    rng = random.Random(seed)
    return [
        ("two sessions", "A", "alice", [BOS] + _text(rng, 3), 3),
        ("", "A", "bob", [BOS] + _text(rng, 2), 3),
        ("resume after the other", "A", "alice", _text(rng, 1), 3),
        ("", "A", "carol", [BOS] + _text(rng, 2), 2),
        ("evicted snapshot", "A", "bob", _text(rng, 1), 2),
        ("power cut", "A", None, None, None),
        ("resume after the power cycle", "A", "carol", _text(rng, 1), 2),
        ("move carol", "B", None, None, None),
        ("resume on device B", "B", "carol", _text(rng, 1), 2),
    ] + _shared_prompt_steps(rng, users=("dave", "erin"), n_new=2)


SCENARIO = scenario()


def software_run(steps, config, model, *, regions=REGIONS, lanes=LANES, chunk=16,
                 tier=None):
    """The scenario with the software device in the FPGA's place (golden models: the
    fixed-point core's model as the rings, a store of ``regions`` records): the same scheduler;
    a power cut keeps the store (and loses the SDRAM hot tier's copies, with ``tier``), a move
    starts a device whose store holds only the moved session's record. Returns the scheduler
    and the generated tokens per request."""
    from ringkv.host.device.software import SoftwareDevice

    def device():
        return SoftwareDevice(config, attention=FixedBackend(config, lanes=lanes),
                              capacity=regions, tier=tier)

    dev = device()
    sched = Scheduler(model, dev, chunk=chunk)
    outs = []
    for label, _, sid, tokens, n_new, *opts in steps:
        if sid is None:
            sched.resident = None
            if label == "power cut":
                dev.lose_sdram()
            if label.startswith("move"):
                key = sched.sessions[label.split()[1]].key
                moved = device()
                moved.write_record(dev.read_record(key))    # the record, copied as bytes
                moved.lose_sdram()      # the simulated device B starts on the copied image
                dev = sched.device = moved
            continue
        outs.append(sched.request(sid, tokens, n_new, **(opts[0] if opts else {})))
    return sched, outs


def run_system_demo(*, workdir=None, verbose=True, seed=0, steps=None, config=None,
                    board=None, sdram=None) -> int:
    steps = SCENARIO if steps is None else steps
    from ringkv.sim.harness import SimDevice, build_top
    if board is not None and sdram is not None:
        raise ValueError("the board top has no SDRAM hot tier yet: sdram needs board=None")
    if board is not None:    # the board top at its pins, same scenario and parameters
        from ringkv.sim.board_harness import BoardDevice as SimDevice
        from ringkv.sim.board_harness import build_board as build_top

    config = DEMO_CONFIG if config is None else config
    say = print if verbose else (lambda *a, **k: None)
    temporary = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ringkv-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    devices = {}
    keep = False
    try:
        status = _run(steps, config, board, workdir, devices, say, seed, SimDevice, build_top,
                      sdram)
        keep = status != 0 and temporary       # the simulators' logs tell what went wrong
        if keep:
            say(f"the simulators' logs are in {workdir}")
        return status
    finally:
        # whatever ended the run (a failure, Ctrl-C, SIGTERM): no simulator left running
        for dev, fpga in devices.values():
            fpga.link.close()
            dev.stop()
        if temporary and not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(steps, config, board, workdir, devices, say, seed, SimDevice, build_top,
         sdram=None) -> int:
    image_a, image_b = workdir / "device-a.img", workdir / "device-b.img"
    for image in (image_a, image_b):
        image.unlink(missing_ok=True)
    top_kwargs = {"regions": REGIONS, "lanes": LANES, "macs": MACS}
    tier = None if sdram is None else ({"part": sdram} if sdram else {})
    if tier is not None:
        top_kwargs["tier"] = tier
    say("RingKV end-to-end demo: host model + simulated FPGA (Verilator"
        + (f", pin-level {board} top" if board else "") + "), config "
        f"layers={config.layers} Hq={config.q_heads} Hkv={config.kv_heads} "
        f"d={config.head_dim} W={config.window} numerics {config.numerics}, {REGIONS} storage "
        f"regions, "
        f"P={LANES} lanes x M={MACS} MACs"
        + ("" if tier is None else ", SDRAM hot tier"))
    t0 = time.monotonic()
    build_top(config, **top_kwargs)
    say(f"Verilator model ready ({time.monotonic() - t0:.0f} s); work dir {workdir}\n",
        flush=True)

    model = (Model.trained(config) if weights_path(config).exists()
             else Model(config, hidden=64, ffn=128, seed=seed))
    steps = [tuple(s) + ({},) * (6 - len(s)) for s in steps]
    plan = [s for s in steps if s[2] is not None]
    t1 = time.monotonic()
    say("computing the software-only reference and the software device's decisions ...",
        flush=True)
    reference = plain_run(model, [(sid, toks, n, opts) for _, _, sid, toks, n, opts in plan],
                          lambda: FixedBackend(config, lanes=LANES), chunk=16)
    # what the software device decides for the same scenario (ringkv demo --software's device)
    twin_sched = software_run(steps, config, model, tier=tier)[0]
    twin = [(e["path"], e["reused"]) for e in twin_sched.events]
    say(f"  done in {time.monotonic() - t1:.0f} s; starting device A ...", flush=True)

    def start(name, image):
        dev = SimDevice(image, config=config, log=workdir / f"sim-{name}.log", prebuilt=True,
                        **top_kwargs)
        fpga = FpgaDevice(Link(dev.url, timeout=120), config)
        devices[name] = (dev, fpga)     # stopped and closed however the run ends
        fpga.check_config()
        st = fpga.wait_ready()          # the device's own recovery scan (power-on)
        return fpga, st["live"], st["freed"]

    t1 = time.monotonic()
    fpga, _, _ = start("A", image_a)
    say(f"device A up in {time.monotonic() - t1:.1f} s")
    sched = Scheduler(model, fpga, chunk=16)
    header = (f"{'#':>2} {'step':30} {'dev':3} {'session':7} {'path':8} {'tokens':>9} "
              f"{'reused':>6} {'computed':>8} {'recomp':>6} {'import B':>8} {'export B':>8} "
              f"{'cycles':>9} {'s':>5}")
    say(header)
    say("-" * len(header))
    outputs, rows, failures = [], [], []
    step = 0
    for label, devname, sid, tokens, n_new, opts in steps:
        if sid is None:
            if label == "power cut":
                dev, old = devices.pop("A")
                old.link.close()
                dev.kill()
                fpga, inserts, frees = start("A", image_a)
                sched.device, sched.resident = fpga, None
                say(f"   -- power cut: simulator A killed and restarted on {image_a.name}; "
                    f"the device recovered its directory from the headers: {inserts} "
                    f"records live, {frees} regions freed")
            else:
                moved = label.split()[1]
                key = sched.sessions[moved].key
                lay = RecordLayout(config)
                region = _region_of(devices["A"][1], key)
                span = lay.sectors_per_region * 512
                data = image_a.read_bytes()[region * span:(region + 1) * span]
                with open(image_b, "wb") as f:
                    f.truncate(REGIONS * span)
                    f.seek(region * span)
                    f.write(data)
                fpga, inserts, _ = start("B", image_b)
                sched.device, sched.resident = fpga, None
                say(f"   -- {moved}'s record (region {region}, {len(data)} B) copied to "
                    f"{image_b.name}; device B started, "
                    f"its recovery found {inserts} record(s)")
            continue
        t = time.monotonic()
        before = dict(fpga.counters)
        out = sched.request(sid, tokens, n_new, **opts)
        e = sched.events[-1]
        cycles = fpga.counters["device_cycles"] - before["device_cycles"]
        outputs.append(out)
        rows.append((e, cycles))
        step += 1
        ok = out == reference[len(outputs) - 1]
        if not ok:
            failures.append(step)
        same = (e["path"], e["reused"]) == twin[len(outputs) - 1]
        if not same:
            failures.append(f"{step}: {e['path']} reusing {e['reused']}, the software device "
                            f"{twin[len(outputs) - 1][0]} reusing {twin[len(outputs) - 1][1]}")
        say(f"{step:>2} {label:30} {devname:3} {sid:7} {e['path']:8} "
            f"{e['before']:>4}->{e['after']:<4} {e['reused']:>6} {e['prefilled']:>8} "
            f"{e['recomputed']:>6} {e['imported_bytes']:>8} {e['exported_bytes']:>8} "
            f"{cycles:>9} "
            f"{time.monotonic() - t:>5.1f}" + ("" if ok else "  MISMATCH")
            + ("" if same else "  OTHER DECISION")
            + f"  {show_text(out)!r}")
        note = event_notes(e)
        if note:
            say(note)
    if tier is not None:
        from ringkv.host.device.board_check import describe_tier
        info, soft = fpga.storage_info(), twin_sched.device.hot_tier()
        say(f"\n{describe_tier(info)}; the software device's twin: {soft['hot_residents']} "
            f"(imports wholly from SDRAM there: {twin_sched.device.counters['imports_sdram']} "
            f"of {twin_sched.device.counters['imports']})")
        if info["hot_residents"] != soft["hot_residents"]:
            failures.append(f"{info['hot_residents']} SDRAM residents, the software device "
                            f"{soft['hot_residents']}")
    for dev, fpga in devices.values():
        fpga.link.close()
        dev.stop()
    devices.clear()

    say("\nsummary")
    for line in path_summary(e for e, _ in rows):
        say(line)
    longest = max(len(s.tokens) for s in sched.sessions.values())
    snap = RecordLayout(config)
    say(f"  longest session {longest} tokens = {longest / config.window:.1f} x W; a snapshot "
        f"is {snap.sectors_per_region * 512} B of storage whatever the length "
        f"(header + up to {config.max_tokens} tokens + {snap.kv_bytes_max} B of K/V)")
    paths = [e["path"] for e, _ in rows]
    needed = {"first", "hit", "miss", "prefix"}
    if not needed <= set(paths):
        failures.append(f"paths {sorted(set(paths))} lack {sorted(needed - set(paths))}")
    if failures:
        say(f"FAILED: {failures}")
        return 1
    shared = sum(e["reused"] for e, _ in rows if e["path"] == "prefix")
    say(f"  tokens imported as a stored prefix (shared prompt, edit): {shared}; prefilled in "
        f"all {sum(e['prefilled'] for e, _ in rows)}")
    say("every decision (path, tokens reused) the same as the software device's for this "
        "scenario")
    say(f"all {sum(map(len, outputs))} generated tokens identical to the software-only run "
        f"({time.monotonic() - t0:.0f} s)")
    return 0


def _region_of(fpga: FpgaDevice, key) -> int:
    from ringkv.defs.protocol import DIR_RESPONSE, REQUESTS, Op, Status
    count, h = key
    status, data = fpga._request(Op.DIR_LOOKUP,
                                 REQUESTS[Op.DIR_LOOKUP].pack(count=count, hash=h),
                                 ok=(Status.OK,))
    return DIR_RESPONSE.unpack(data)["region"]
