"""The ``fl-attack`` command line.

    fl-attack attack --dataset femnist --methods pisme,ig --clients 3 --iterations 200 --out results/attack

``attack`` runs the standalone experiment of fl_attack.standalone: it trains N real victim
clients under the paper protocol, attacks each update with each method and writes results.csv,
per-attack traces and image grids. Every setting is checked before any training, the --out folder
included (created, and a file written and removed in it); a bad one ends the command with a
one-line ``fl-attack: error: ...`` message and exit status 2.

Exit status: 0 when at least one attack succeeded, 1 when every attack failed or a run-time error
(e.g. a full disk) ended the run (one ``fl-attack: error:`` line, no traceback), 2 for a bad
setting, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict, fields
from pathlib import Path

from fl_attack.attacker.api import DEVICES, check_device
from fl_attack.attacker.attacks import ATTACKS, AttackConfig, check_compile, check_own_settings
from fl_attack.attacker.attacks.base import COMPILE_MODES
from fl_attack.attacker.labels import LABEL_MODES, check_label_mode
from fl_attack.attacker.memory import MEMORY_MODES, MEMORY_SUFFIX, check_memory_mode, memory_methods
from fl_attack.attacker.precision import PRECISIONS, check_precision
from fl_attack.evaluation.verdict import verdict_line
from fl_attack.federation.config import PRESETS, parse_key_values
from fl_attack.federation.data import DATASETS
from fl_attack.standalone import (
    DEFAULT_PRESET,
    RESULT_COLUMNS,
    AttackSettings,
    run_attack_experiment,
    validate_settings,
)

PROG = "fl-attack"
EXIT_FAILED = 1
EXIT_USAGE = 2

_PRESET_LINES = "".join(
    f"  {p.name:6s} k={p.protocol.samples}, B={p.protocol.batch_size}, E={p.protocol.local_epochs}, "
    f"lr={p.protocol.lr:g}, {'m, iterations by T' if p.rule else f'{p.iterations} iterations, m={p.nodes}'}: {p.note}\n"
    for p in PRESETS.values()
)

ATTACK_EPILOG = f"""\
outputs (under --out):
  results.csv                  one row per client and method, columns:
                               {", ".join(RESULT_COLUMNS[:8])},
                               {", ".join(RESULT_COLUMNS[8:15])},
                               {", ".join(RESULT_COLUMNS[15:21])},
                               {", ".join(RESULT_COLUMNS[21:])}
                               (psnr in dB, ssim in [-1,1], fsim in [0,1], lpips >= 0, lsim in [0,2],
                               label_accuracy in [0,1], attack_seconds of attack wall time;
                               gradients_per_iteration is m for pisme, 1 for the single-gradient
                               attacks; the columns are attacks.csv's, docs/run-folder.md). Rewritten
                               atomically after every attack; a failed attack is a row of NaNs.
  trace-<client>-<method>.csv  loss, honest/calibrated Lsim, TV, the attack's variables and the
                               evaluator's PSNR every --trace-every iterations
  client-<client>-<method>.png originals (top row) over their matched reconstructions
  settings.json                the settings of the run

CPU-friendly settings (measured on a 2-core CPU machine, FEMNIST k=50, B=10, E=20 so T=100; the
attack time grows linearly with --iterations and with k, and for pisme faster than linearly with m):
  fl-attack attack --iterations 200 --device cpu
    per client: victim training ~1.5 s; per attack with 200 iterations: pisme (m=7) 100-210 s
    (0.5-1.0 s/iteration), nlsme, sme and ig ~10 s each (~0.05 s/iteration). --nodes 3 costs
    ~0.17 s/iteration. 200 iterations came within 0.1 dB of 300 on the FEMNIST writer we checked
    (PSNR plateaus after the first learning-rate drop). On a machine shared with other jobs expect 5-10x more.
  The paper's 1000 iterations take 5x as long; use --device cuda where available.

presets (--preset NAME; explicit flags and --option win over the preset):
{_PRESET_LINES}
examples:
  fl-attack attack --iterations 200 --methods pisme,ig --out results/quick
  fl-attack attack --preset cpu --methods pisme --option tv_weight=0.02,lr_control_point=1e-4
  fl-attack attack --dataset cifar100 --classes 10 --samples 50 --clients 2 --iterations 300
  fl-attack attack --labels oracle --nodes 3 --iterations 100
  fl-attack attack --device cuda --precision auto
"""


# The flags a --preset sets: (flag, type, metavar, help without the default).
_PRESET_FLAGS = [
    ("--samples", int, "K", "private training samples k per client, integer >= 1"),
    ("--batch-size", int, "B", "local SGD batch size B, 1 <= B <= k"),
    ("--local-epochs", int, "E", "local epochs E, integer >= 1; T = E*ceil(k/B) local steps"),
    ("--lr", float, "ETA", "local SGD learning rate eta > 0, no momentum"),
    ("--iterations", int, "K", "attack optimisation steps (Adam), integer >= 1"),
    ("--nodes", int, "M", "Gauss-Legendre nodes m of PI-SME, integer >= 1; the cost per iteration grows with m"),
]


class UsageError(Exception):
    """A bad setting found before any work started: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line: 'fl-attack: error: ...' and exit status 2."""

    def error(self, message):
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _methods(text: str) -> tuple[str, ...]:
    """The --methods list; "METHOD+memory" names pass here (replay checks them against --memory)."""
    names = tuple(m.strip() for m in str(text).split(",") if m.strip())
    try:
        memory_methods(text, "labels" if any(m.endswith(MEMORY_SUFFIX) for m in names) else "none")
        return names
    except ValueError as exc:  # argparse reports only ArgumentTypeError's message
        raise argparse.ArgumentTypeError(str(exc)) from None


def _checked(check):
    """An argparse ``type`` of a checker of the attacker's (its one check of the value): its ValueError
    as argparse's "argument --FLAG: <the checker's message>"."""

    def value(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    value.__name__ = check.__name__
    return value


def _add_attack_choice(
    parser, methods, labels, device, methods_text, labels_text, device_text, precision_text="fp32"
) -> None:
    """--methods, --labels, --device and --precision, shared by ``attack`` and ``replay`` (defaults
    and their text; --precision's default is None, not given: fp32 for ``attack``, the run's for
    ``replay``)."""
    parser.add_argument(
        "--methods",
        type=_methods,
        default=methods,
        metavar="LIST",
        help=f"comma-separated attacks from {', '.join(sorted(ATTACKS))} (default: {methods_text})",
    )
    parser.add_argument(
        "--labels",
        type=_checked(check_label_mode),
        metavar="{" + ",".join(LABEL_MODES) + "}",
        default=labels,
        help="labels the attack uses: recovered from the update's output-bias change, or the true labels "
        f"(oracle, an explicit leak, recorded in the labels column) (default: {labels_text})",
    )
    parser.add_argument(
        "--device",
        type=_checked(check_device),
        metavar="{" + ",".join(DEVICES) + "}",
        default=device,
        help=f"where training and attacks run; auto = cuda if available (default: {device_text})",
    )
    parser.add_argument(
        "--precision",
        type=_checked(check_precision),
        metavar="{" + ",".join(PRECISIONS) + "}",
        default=None,
        help="the attacks' arithmetic: fp32; bf16 (bfloat16 autocast, float32 master copies and sums); "
        "tf32 (CUDA only); auto = the fastest the device accelerates (fp32 on a CPU without native bf16) "
        f"(docs/performance.md, Mixed precision) (default: {precision_text})",
    )
    parser.add_argument(
        "--compile",
        type=_checked(check_compile),
        metavar="{" + ",".join(COMPILE_MODES) + "}",
        default=None,
        help="run each attack step as one torch.compile'd torch.func function (compiled once per process and "
        "problem; eager with the reason where it cannot be); auto = on CUDA only, where it was measured faster "
        f"(docs/performance.md, Compiled step) (default: {'auto' if precision_text == 'fp32' else precision_text})",
    )


def _add_flags(parser, *flags) -> None:
    """Options that take one value, each given as (flag, type, default, metavar, help)."""
    for flag, kind, default, metavar, text in flags:
        parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description="Honest-but-curious server attacks (PI-SME, NL-SME, SME, IG) on FedAvg client updates."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    a = sub.add_parser(
        "attack",
        help="train real victim clients and reconstruct their images from their updates",
        description="Train N real victim clients (FedAvg local epochs, plain SGD), attack each observed "
        "update (w0, wT, metadata) with each method, score the reconstructions against the "
        "ground truth (evaluator only) and write the results. Defaults are the paper's protocol.",
        epilog=ATTACK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = AttackSettings()
    # fmt: off
    _add_flags(a, ("--dataset", str, d.dataset, "{" + ",".join(sorted(DATASETS)) + "}",
                   "victim dataset: femnist (1x28x28, 62 classes, one client per LEAF writer), cifar100 "
                   f"(3x32x32, 100 classes) or femnist-digits (femnist's digits, 10 classes) (default: {d.dataset})"))
    _add_attack_choice(a, d.methods, d.labels, d.device, f"{','.join(d.methods)}", d.labels, d.device)
    _add_flags(a, ("--clients", int, d.clients, "N",
                   f"number of victim clients, partition ids 0..N-1, integer >= 1 (default: {d.clients})"))
    a.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="the victims' protocol (k, B, E, lr) and the attack's iterations and m from a named preset "
                   "(see below); explicit flags win (default: paper)")
    preset_flags = [  # None: not given, the preset fills it
        (flag, kind, None, metavar, f"{text}; a preset setting (default: {getattr(d, flag[2:].replace('-', '_'))})")
        for flag, kind, metavar, text in _PRESET_FLAGS
    ]
    _add_flags(
        a, *preset_flags,
        ("--classes", int, None, "C", "cifar100 only: each client's samples come from C classes, 1 <= C <= 100 "
         "(default: a uniform draw over all classes)"),
        ("--label-refine", float, None, "F", "with recovered labels, re-estimate the label counts once on the "
         "reconstruction after this fraction of the iterations, 0 <= F < 1 (not in the paper; helps after long "
         "local training, docs/attack-core.md) (default: 0, labels fixed)"),
        ("--seed", int, None, "S", "seed of the initial model w0, the victims' batch shuffling, the client draw "
         f"and the attack's initial images (default: {d.seed})"),
        ("--data-dir", str, None, "DIR", "dataset on disk: a LEAF FEMNIST directory (train/*.json, test/*.json), "
         "torchvision's cifar-100-python/ root, or an .npz in the bundled format (default: the bundled real "
         "sample)"),
        ("--model", str, d.model, "SPEC", "the victims' model: 'paper' (the paper's CNN for the dataset) or "
         "'package.module:factory', a callable returning an nn.Module that maps normalised NCHW images to "
         '(N, classes) logits, importable here (docs/library.md, "Attacking your own model") (default: paper)'),
        ("--trace-every", int, None, "N", "record the trace (and the evaluator's PSNR) every N iterations, "
         f"integer >= 1 (default: {d.trace_every})"),
    )
    a.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any AttackConfig setting for every method, e.g. tv_weight=0.02 or "
                   '"lr_control_point=1e-4,tv_reduction=sum"; repeatable. iterations, nodes, trace_every, '
                   "seed, label_refine, precision and compile have flags of their own: give one or the other "
                   "(default: none)")
    _add_flags(a, ("--out", str, "results/attack", "DIR",
                   "output folder, created if missing; results.csv in it is replaced (default: results/attack)"))
    # fmt: on
    a.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    a.set_defaults(handler=_attack)
    _add_replay_parser(sub)

    return parser


def _prepare_out(out: Path) -> None:
    """Create the --out folder and check a file can be written in it (root ignores file modes, so
    it is tried, not asked with os.access). Raises UsageError with one line otherwise."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None


def _settings(args) -> AttackSettings:
    """The flags as AttackSettings: what is given, then --option, then the --preset (default: the
    paper's, DEFAULT_PRESET). UsageError for a bad --option or one that sets what a flag given sets
    too (``check_own_settings``)."""
    flags = {f.name: getattr(args, f.name, None) for f in fields(AttackConfig)}  # the AttackConfig settings with a flag
    flags = {key: value for key, value in flags.items() if value is not None}
    try:
        options = parse_key_values(",".join(args.option), asdict(AttackConfig()), "--option", "attack setting")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        check_own_settings(options, {key: f"--{key.replace('_', '-')}" for key in flags})
    except ValueError as exc:
        raise UsageError(f"--option: {exc}") from None
    options |= flags
    if not options.get("label_refine", 1):  # 0: the labels stay fixed, AttackConfig's default
        del options["label_refine"]
    own = {f.name for f in fields(AttackSettings)}  # iterations, nodes, trace_every, seed, precision
    given = {key: options.pop(key) for key in sorted(options.keys() & own)}
    given |= {key: getattr(args, key) for key in ("samples", "batch_size", "local_epochs", "lr")}
    preset = PRESETS[args.preset] if args.preset else DEFAULT_PRESET
    if preset.rule:  # the audit's rule picks what no flag or --option gives, per victim (fl_attack.attacker.rule)
        auto = [name for name in ("nodes", "iterations") if given.get(name) is None]
        auto += [] if {"lr_images", "lr_decay", "lr_schedule"} & options.keys() else ["schedule"]
        options["auto"] = tuple(auto)
    values = {
        **asdict(preset.protocol),
        **preset.attack_overrides(),
        **{k: v for k, v in given.items() if v is not None},
    }
    return AttackSettings(
        dataset=args.dataset,
        methods=tuple(args.methods),
        clients=args.clients,
        classes=args.classes,
        labels=args.labels,
        device=args.device,
        data_dir=args.data_dir,
        model=args.model,
        overrides=options,
        preset=args.preset or "",
        **values,
    )


def _attack(args) -> int:
    settings = _settings(args)
    try:  # every check before any training or any file is written
        pool = validate_settings(settings)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out)
    _prepare_out(out)
    rows = run_attack_experiment(settings, out, progress=not args.no_progress, pool=pool)
    failed = sum(1 for r in rows if r["psnr"] != r["psnr"])
    for row in rows:
        print(f"{PROG}: client {row['partition_id']} {row['method']}: {verdict_line(row)}", file=sys.stderr)
    print(f"{PROG}: {len(rows)} attack(s), {failed} failed; results in {out / 'results.csv'}", file=sys.stderr)
    if rows and failed == len(rows):
        print(f"{PROG}: error: every attack failed; see the messages above", file=sys.stderr)
        return EXIT_FAILED
    return 0


REPLAY_EPILOG = """\
outputs (under RUN_DIR/replays/NAME/, a run folder of its own):
  config.json      the run's config, with the replay's methods, labels and attack settings in its
                   run_config, so that python -m analysis.report RUN_DIR RUN_DIR/replays/NAME
                   compares the two; "replay" names the run replayed
  attacks.csv      one row per recorded update and method (the run's attacks.csv columns), appended
                   atomically as each attack finishes; a failed attack is a row with status=failed
  rounds.csv       the run's, copied (the federation is the same)
  images/, events.log, summary.json
With --missing the rows of the attacks an interrupted run left undone go to RUN_DIR/attacks.csv.

The attacks run in this process one after another (--workers 0), or on N local processes
(--workers N) or N Ray actors (--ray-address ADDR --workers N); this process scores each one and
writes its row as it finishes (in finishing order; worker_node and worker_id say where it ran).
The same method, settings and seed reproduce the run's rows' PSNR exactly, in this process and on
local --workers alike: by default each attack runs with the torch threads its recorded row names
(attacks.csv's threads column).
Exit status: 0, 1 when every attack failed, 2 for bad input (found before any attack).

examples:
  fl-attack replay results/run-a --methods pisme,sme
  fl-attack replay results/run-a --methods ig --labels oracle --rounds 1,5 --threads 2
  fl-attack replay results/run-a --methods pisme --nodes 7 --iterations 1000 --options tv_weight=0.02
  fl-attack replay results/run-a --methods pisme,ig --workers 4 --threads 1
  fl-attack replay results/run-a --methods pisme --ray-address 10.0.0.5:6379 --workers 16 --threads 2
  fl-attack replay results/run-a --missing
"""


def _rounds(text: str) -> tuple[int, ...]:
    try:
        rounds = tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rounds must be comma-separated round numbers such as 1,5, got '{text}'"
        ) from None
    if not rounds or min(rounds) < 1:
        raise argparse.ArgumentTypeError(f"rounds must be round numbers >= 1, got '{text}'")
    return rounds


def _add_replay_parser(sub) -> None:
    r = sub.add_parser(
        "replay",
        help="attack a run's recorded updates again, offline, with other methods or settings",
        description="Re-attack the updates a federation recorded (RUN_DIR/updates/, checksums verified) with "
        "other methods or settings, score them against the ground truth and write the result as "
        "a run folder under RUN_DIR/replays/NAME/; or, with --missing, complete the attacks an "
        "interrupted run left undone. Defaults are the run's own settings.",
        epilog=REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("run_dir", metavar="RUN_DIR", help="a run folder with recorded updates (record-updates=true)")
    _add_attack_choice(r, None, None, "auto", "the run's", "the run's", "auto", "the run's")
    # fmt: off
    _add_flags(
        r,
        ("--iterations", int, None, "K", "attack optimisation steps, integer >= 1 (default: the run's)"),
        ("--nodes", int, None, "M", "Gauss-Legendre nodes m of PI-SME, integer >= 1 (default: the run's)"),
        ("--options", str, "", "K=V,...",
         'further AttackConfig settings on top of the run\'s, e.g. "tv_weight=0.02,label_refine=0.25"'),
        ("--rounds", _rounds, None, "LIST", "only these recorded rounds, e.g. 1,5 (default: every recorded round)"),
        ("--threads", int, 0, "N", "torch threads for each attack (per worker) (default: 0, the threads each "
         "attack of the run recorded, which reproduces its rows exactly; for a run without them torch's own "
         "choice, with --workers N this process's count split over the N processes, 1 per Ray actor)"),
        ("--workers", int, 0, "N", "run the attacks on N local processes (with --ray-address: N Ray actors, at "
         "least 1), each with --threads torch threads, at most 2N queued (default: 0, this process, one after "
         "another)"),
        ("--ray-address", str, "", "ADDR", "run the attacks on the running Ray cluster at ADDR: auto, HOST:PORT or "
         "ray://HOST:PORT (from `ray start --head`) (default: none)"),
        ("--name", str, None, "NAME", "the replay's folder under RUN_DIR/replays/ (default: built from the settings)"),
        ("--batch", str, None, "N", "run up to N attacks of one round (same method, model, k) as one batched attack "
         "(reconstruct_batch), with the rows of the unbatched ones; auto = 16 on CUDA, 1 on the CPU "
         "(default: the run's attack-batch)"),
    )
    r.add_argument("--memory", default=None, type=_checked(check_memory_mode),
                   metavar="{" + ",".join(MEMORY_MODES) + "}",
                   help="the replaying server remembers each client across its rounds (docs/attacker-memory.md): "
                   "every method also runs as METHOD+memory (default: the run's attack-memory)")
    _add_flags(r, ("--memory-rounds", str, None, "CHOICE", "joint: the earlier rounds fitted with each round, "
                   "'best:N,latest:M' or 'all' (default: the run's attack-memory-rounds)"))
    r.add_argument("--missing", action="store_true",
                   help="complete the run itself: attack the recorded updates that have no row in its "
                   "attacks.csv, with its own methods and settings, and append their rows there")
    # fmt: on
    r.set_defaults(handler=_replay)


def _replay(args) -> int:
    from fl_attack.audit.replay import ReplayError, prepare_replay, run_replay

    try:  # every check before any attack
        keys = ("methods", "labels", "iterations", "nodes", "options", "rounds", "threads", "device", "name")
        keys += ("missing", "workers", "ray_address", "memory", "memory_rounds", "precision", "compile", "batch")
        replay = prepare_replay(args.run_dir, **{key: getattr(args, key) for key in keys})
    except ReplayError as exc:
        raise UsageError(str(exc)) from None
    if not replay.work:
        print(f"{PROG}: replay: nothing to attack in {args.run_dir}", file=sys.stderr)
        return 0
    try:
        rows = run_replay(replay)
    except ReplayError as exc:  # the Ray cluster could not be joined; nothing written
        raise UsageError(str(exc)) from None
    failed = sum(r["status"] != "ok" for r in rows)
    print(
        f"{PROG}: replay: {len(rows)} attack(s), {failed} failed; rows in {replay.out / 'attacks.csv'}", file=sys.stderr
    )
    return 1 if rows and failed == len(rows) else 0


def main(argv=None) -> int:
    """Entry point of the ``fl-attack`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as exc:  # after validation: a run-time failure (a full disk...), one line
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; rows already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
