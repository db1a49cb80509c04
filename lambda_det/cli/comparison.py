"""A backbone comparison under one recipe: every (variant, seed) pair trained and evaluated by
train_net (:data:`lambda_det.cli.interrupts.TRAIN_NET`) into its own folder,
``OUTPUT/<variant>/seed<SEED>/``, then reported by :mod:`lambda_det.reports.compare_report`.

A variant is a name and ``MODEL.LAMBDA_RESNET.*`` overrides on the shared config: only the
backbone may differ, so the recipe stays the same. Each run is a separate train_net.py process
(its own logs, OUTPUT_DIR lock, launcher and global state) started with ``--resume``: a new
pair trains from scratch, an interrupted one continues from its last checkpoint, and a finished
one (with eval_results.json) is not started at all. Each folder records the full config of its
run (``compare_recipe.yaml``, written before training); a later invocation whose config differs
stops before training anything, so runs of two recipes never mix in one report.

Ctrl-C reaches the parent and its train_net.py child alike (one process group): the child
saves the iteration in flight and stops, and :class:`RunInterrupted` names the run and how to
continue; the child's own line is dropped (:func:`lambda_det.cli.interrupts.run_child`).
"""

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import lambda_det.modeling  # noqa: F401  (registers the backbones for the parameter counts)
from lambda_det.checkpoint import checkpoint_to_resume, last_checkpoint
from lambda_det.cli.checks import check_model
from lambda_det.cli.interrupts import run_child
from lambda_det.config import resolve_config_file
from lambda_det.data.coco import coco_dataset_overrides
from lambda_det.modeling.mixers import MIXERS
from lambda_det.run_config import config_differences, get_cfg, load_config
from lambda_det.utils.atomic import atomic_path, reporting_write_errors
from lambda_det.utils.errors import ExistingFileError, UserError

__all__ = [
    "Variant",
    "PairRun",
    "Comparison",
    "BASELINES",
    "variant_presets",
    "DEFAULT_VARIANTS",
    "RECIPE_FILE",
    "RunFailedError",
    "RunInterrupted",
    "parse_variant",
    "plan_comparison",
    "run_comparison",
    "count_parameters",
]

KEY_PREFIX = "MODEL.LAMBDA_RESNET."
RECIPE_FILE = "compare_recipe.yaml"
# The paper's Table 14 baselines: the conv twin (ResNet-RS) and the +SE twin.
BASELINES: Dict[str, Tuple[str, ...]] = {
    "conv": (KEY_PREFIX + "PLACEMENT", "none"),
    "se": (KEY_PREFIX + "PLACEMENT", "none", KEY_PREFIX + "SE", "True"),
}
DEFAULT_VARIANTS = ("conv", "se", "lambda")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_PER_RUN_KEYS = ("SEED", "OUTPUT_DIR")


class RunFailedError(RuntimeError):
    """A train_net.py run of the comparison ended without results."""


class RunInterrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped a train_net.py run of the comparison; the message names it
    and says how to continue; ``status``: the exit status (130, 143)."""

    def __init__(self, message: str, status: int = 130):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: Tuple[str, ...]  # KEY VALUE KEY VALUE ...


@dataclass(frozen=True)
class PairRun:
    variant: Variant
    seed: int
    folder: Path
    opts: Tuple[str, ...]  # every override train_net.py gets: shared, variant, SEED, OUTPUT_DIR
    recipe: str  # the run's full config (without OUTPUT_DIR), as YAML

    @property
    def finished(self) -> bool:
        return (self.folder / "eval_results.json").is_file()

    @property
    def started(self) -> bool:
        return last_checkpoint(str(self.folder)) is not None


@dataclass(frozen=True)
class Comparison:
    config_file: str
    opts: Tuple[str, ...]
    variants: Tuple[Variant, ...]
    seeds: Tuple[int, ...]
    output: Path
    runs: Tuple[PairRun, ...]
    parameters: Dict[str, Dict[str, int]]


def variant_presets() -> Dict[str, Tuple[str, ...]]:
    """The variants known by name: the :data:`BASELINES`, then every registered mixer in the
    config's placement (``lambda``: MIXER lambda, ``aft_conv``, ...; the "conv" mixer is the conv
    baseline)."""
    mixers = {name: (KEY_PREFIX + "MIXER", name) for name in MIXERS if name not in BASELINES}
    return {**BASELINES, **mixers}


def parse_variant(spec: str) -> Variant:
    """``NAME`` (one of :func:`variant_presets`) or ``NAME:KEY=VALUE,KEY=VALUE`` where KEY is a
    ``MODEL.LAMBDA_RESNET`` key, with or without that prefix (e.g. ``k8:DIM_K=8,HEADS=8``,
    ``h4:AFT_CONV.HEADS=4``). ``NAME:`` alone is the base config as it is."""
    name, colon, body = spec.partition(":")
    if not _NAME.match(name):
        raise UserError(
            f"variant name {name!r} (in {spec!r}) names a folder: use letters, "
            f"digits and _ . + - (e.g. lambda_k8:DIM_K=8)"
        )
    if not colon:
        presets = variant_presets()
        if name not in presets:
            raise UserError(
                f"unknown variant {name!r}: name one of {', '.join(presets)}, or "
                f"define it as NAME:KEY=VALUE,KEY=VALUE (e.g. k8:DIM_K=8)"
            )
        return Variant(name, presets[name])
    backbone_keys = get_cfg().MODEL.LAMBDA_RESNET
    overrides: List[str] = []
    # Split at the commas that start a new KEY=, so that list values (a,b) stay whole.
    for item in re.split(r",(?=\s*[A-Za-z_][A-Za-z0-9_.]*\s*=)", body) if body.strip() else []:
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals or not key or not value:
            raise UserError(
                f"variant {spec!r}: {item!r} is not KEY=VALUE (e.g. {name}:PLACEMENT=c4,DIM_K=8)"
            )
        if "." not in key or key.split(".")[0] in backbone_keys:  # short: DIM_K, AFT_CONV.HEADS
            key = KEY_PREFIX + key
        if not key.startswith(KEY_PREFIX):
            raise UserError(
                f"variant {name!r} sets {key}: a variant may change only "
                f"{KEY_PREFIX}* keys (the backbone); put recipe changes in the "
                f"shared KEY VALUE overrides, which every variant gets"
            )
        overrides += [key, value]
    return Variant(name, tuple(overrides))


def count_parameters(cfg) -> Dict[str, int]:
    """Parameters of the model and of its image network (the ResNet without FPN), counted on a
    model built on the meta device (no memory, no random numbers)."""

    model = check_model(cfg)
    backbone = getattr(model.backbone, "bottom_up", model.backbone)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "backbone_parameters": sum(p.numel() for p in backbone.parameters()),
    }


def _recipe(cfg) -> str:
    """The config a run trains with, without OUTPUT_DIR (a moved --output is the same run)."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.OUTPUT_DIR = ""
    return cfg.dump()


def _with_run(cfg, seed: int, folder: Path):
    """``cfg`` with one run's SEED and OUTPUT_DIR."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.SEED, cfg.OUTPUT_DIR = seed, str(folder)
    cfg.freeze()
    return cfg


def _check_folder(run: PairRun) -> None:
    """A pair's folder is new, empty, or holds a run of the same recipe (never mixed or
    replaced: the user's results stay)."""
    recorded = run.folder / RECIPE_FILE
    if recorded.is_file():
        differences = config_differences(recorded.read_text(), run.recipe, str(recorded))
        if differences:
            raise UserError(
                f"{run.folder} holds a {run.variant.name} run of another config "
                f"({differences[0]}): rerun with the config and overrides "
                f"it was started with, or pass another --output"
            )
    elif run.folder.is_dir() and any(run.folder.iterdir()):
        raise ExistingFileError(
            f"{run.folder} holds files but no {RECIPE_FILE}, so it is not a "
            f"run of this comparison: pass another --output"
        )
    if not run.finished:
        checkpoint_to_resume(str(run.folder))  # what train_net.py --resume will continue from


def plan_comparison(
    config: str,
    opts: Sequence[str],
    variants: Sequence[Variant],
    seeds: Sequence[int],
    output: str,
    dataset: Optional[str] = None,
    coco_datasets: Sequence[Sequence[str]] = (),
) -> Comparison:
    """Every (variant, seed) run with its config, checked before anything trains: the config
    and overrides load, each variant's model builds (on the meta device) and differs from the
    others', seeds are fixed and distinct, and no run folder holds another recipe.
    ``coco_datasets`` (``[name, json_file, image_root]`` triples, ``--coco-dataset``) are added
    to ``DATASETS.COCO_INSTANCES`` as an override that every run gets.

    Raises:
        ValueError, FileNotFoundError, FileExistsError, IsADirectoryError: a mistake in the
            input (one line), or an unfinished run's last_checkpoint that names no checkpoint.
    """
    config_file = os.path.abspath(resolve_config_file(config))
    opts = tuple(opts)
    if len(opts) % 2:
        raise UserError(
            f"config overrides must be KEY VALUE pairs, got an odd number: {list(opts)}"
        )
    for key in opts[::2]:
        if key in _PER_RUN_KEYS:
            raise UserError(
                f"{key} is set per run (SEED by --seeds, OUTPUT_DIR by --output "
                f"as OUTPUT/<variant>/seed<SEED>): remove it from the overrides"
            )
    if coco_datasets:
        configured = load_config(config_file, opts).DATASETS.COCO_INSTANCES
        opts += tuple(coco_dataset_overrides(configured, coco_datasets))
    if not variants:
        raise UserError("no variants to compare: pass --variant NAME ...")
    names = [v.name for v in variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UserError(
            f"variant names repeat ({', '.join(duplicates)}): give each a "
            f"distinct name (NAME:KEY=VALUE,...)"
        )
    if not seeds:
        raise UserError("no seeds: pass --seeds with one or more SEED values (e.g. 0 1 2)")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UserError(
                f"seed {seed!r} is not an integer >= 0: a comparison needs fixed "
                f"seeds (SEED -1 would draw a new one each run)"
            )
    if len(set(seeds)) != len(seeds):
        raise UserError(f"seeds repeat in {list(seeds)}: pass distinct SEED values")
    output = Path(output).resolve()
    parameters, models, runs = {}, {}, []
    for variant in variants:
        # Loaded once; each seed's run is this config with its SEED and OUTPUT_DIR, as the
        # child merges them from its command line (run_opts).
        cfg = load_config(config_file, opts + variant.overrides + ("SEED", str(seeds[0])))
        if not cfg.DATASETS.TEST:
            raise UserError(
                "DATASETS.TEST is empty: a comparison needs a test dataset "
                "(e.g. DATASETS.TEST \"('coco_2017_val',)\")"
            )
        if len(cfg.DATASETS.TEST) > 1 and dataset is None:
            raise UserError(
                f"DATASETS.TEST has several datasets {tuple(cfg.DATASETS.TEST)}: "
                f"pass --dataset NAME, the one the report compares"
            )
        if dataset is not None and dataset not in cfg.DATASETS.TEST:
            raise UserError(
                f"--dataset {dataset!r} is not in DATASETS.TEST "
                f"{tuple(cfg.DATASETS.TEST)}: name one of them"
            )
        recipe = _recipe(cfg)
        for other, other_recipe in models.items():
            if other_recipe == recipe:
                raise UserError(
                    f"variants {other!r} and {variant.name!r} train the same model from "
                    f"{config}: start from a config whose backbone differs from both (e.g. a "
                    f"lambda_* config), or give one of them its overrides "
                    f"(e.g. --variant lambda:PLACEMENT=paper)"
                )
        models[variant.name] = recipe
        parameters[variant.name] = count_parameters(cfg)
        for seed in seeds:
            folder = output / variant.name / f"seed{seed}"
            run_opts = opts + variant.overrides + ("SEED", str(seed), "OUTPUT_DIR", str(folder))
            run = PairRun(variant, seed, folder, run_opts, _recipe(_with_run(cfg, seed, folder)))
            _check_folder(run)
            runs.append(run)
    return Comparison(
        config_file, opts, tuple(variants), tuple(seeds), output, tuple(runs), parameters
    )


def train_command(
    train_net: Sequence[str], comparison: Comparison, run: PairRun, num_gpus: int = 1
) -> List[str]:
    """The train_net command of one pair (``train_net``: the words that start it,
    :data:`lambda_det.cli.interrupts.TRAIN_NET`): ``--resume`` continues an interrupted run from
    its last checkpoint; without one, ``--restart`` starts it from scratch (the files of a run
    stopped before its first checkpoint move to previous_<date-time>/)."""
    start = "--resume" if run.started else "--restart"
    return [
        *train_net,
        "--config-file",
        comparison.config_file,
        "--num-gpus",
        str(num_gpus),
        start,
        *run.opts,
    ]


def run_comparison(
    comparison: Comparison,
    train_net: Sequence[str],
    num_gpus: int = 1,
    log: Callable[[str], None] = print,
) -> None:
    """Train and evaluate every unfinished pair, one after another (each on ``num_gpus``
    processes through train_net's launcher; ``train_net``: the command that starts it, as for
    :func:`train_command`); finished pairs are reused.

    Raises:
        RunFailedError: a run exited with an error or wrote no eval_results.json; the runs
            before it are kept, and the same call continues from there.
        RunInterrupted: Ctrl-C stopped a run (the same call continues it).
    """
    total = len(comparison.runs)
    for index, run in enumerate(comparison.runs, start=1):
        where = f"[{index}/{total}] {run.variant.name} seed {run.seed}"
        if run.finished:
            log(f"{where}: finished, reusing {run.folder}")
            continue
        recorded = run.folder / RECIPE_FILE
        with reporting_write_errors(run.folder, "--output"):
            run.folder.mkdir(parents=True, exist_ok=True)
            if not recorded.is_file():
                with atomic_path(recorded) as temporary, open(temporary, "w") as f:
                    f.write(run.recipe)
        command = train_command(train_net, comparison, run, num_gpus)
        state = "continuing from its last checkpoint" if run.started else "training"
        log(f"{where}: {state} in {run.folder}\n  {shlex.join(command)}")
        try:
            status = run_child(command)
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM under reporting_interrupts
            latest = last_checkpoint(str(run.folder))
            resumes = (
                f"it resumes from {latest}"
                if latest
                else "it starts over: it had written no checkpoint"
            )
            raise RunInterrupted(
                f"{run.variant.name} seed {run.seed} in {run.folder}: the same command "
                f"continues the comparison ({resumes}; finished runs are reused)",
                status=getattr(interrupt, "status", 130),
            ) from None
        if status != 0:
            raise RunFailedError(
                f"{run.variant.name} seed {run.seed} failed (exit status {status}): see its "
                f"output above and {run.folder / 'log.txt'}; the same command continues the "
                f"comparison from there"
            )
        if not run.finished:
            raise RunFailedError(
                f"{run.variant.name} seed {run.seed} ended without "
                f"{run.folder / 'eval_results.json'}: see its log.txt"
            )
