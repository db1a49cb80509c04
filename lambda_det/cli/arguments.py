"""What every tool's command line shares: ``--config-file``, ``--debug`` and trailing ``KEY VALUE``
overrides (options may follow them), and user errors reported as one ``error: ...`` line with exit
status 2 (as argparse's own usage errors), the traceback kept for ``--debug``."""

import argparse
import contextlib
import os
import re
import sys
from typing import Optional, Sequence, Tuple

from lambda_det.utils.errors import UserError

__all__ = [
    "USAGE_ERROR_STATUS",
    "USER_ERRORS",
    "reporting_user_errors",
    "tool_argument_parser",
    "add_debug_and_overrides",
    "parse_command_line",
]

USAGE_ERROR_STATUS = 2  # as argparse's own usage errors
# The project's exception of a user's mistake (the message names it, with its fix): a config's
# (ConfigFileError), a file's (MissingFileError, NotTextError, UnsafeCheckpointError,
# CorruptCheckpointError), a folder's (OutputDirBusyError, OutputWriteError), a model's
# (WeightsMismatchError, a name that detectron2's registries lack). Any other exception, a
# builtin FileNotFoundError, KeyError or ValueError included, is a bug and keeps its traceback;
# so is anything once training has started, but for a disk that cannot be written
# (OutputWriteError).
USER_ERRORS = (UserError,)


def _one_line(error: BaseException) -> str:
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    return " ".join(str(message).split())


@contextlib.contextmanager
def reporting_user_errors(debug: bool = False, errors: Tuple[type, ...] = USER_ERRORS):
    """Turn an exception of ``errors`` (default :data:`USER_ERRORS`) into
    ``error: <message>`` on stderr and exit status 2 (with ``debug``, let it through with its
    traceback). Any other exception keeps its traceback."""
    try:
        yield
    except Exception as error:
        if debug or not isinstance(error, errors):
            raise
        print(f"error: {_one_line(error)}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_ERROR_STATUS) from None


def doc_argument_parser(doc: str) -> argparse.ArgumentParser:
    """A tool's parser whose help is its docstring: the first line, then the rest as written."""
    return argparse.ArgumentParser(
        description=doc.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(doc.split("\n")[1:]),
    )


def tool_argument_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a tool that takes one config: its docstring as help, and
    ``--config-file``/``--config`` (a path or a shipped config's name). Finish it with
    :func:`add_debug_and_overrides` after the tool's own arguments."""
    parser = doc_argument_parser(doc)
    parser.add_argument(
        "--config-file",
        "--config",
        required=True,
        metavar="FILE",
        help="a config path, or the name of a shipped config",
    )
    return parser


def add_debug_argument(
    parser: argparse.ArgumentParser, errors: str = "errors in the input"
) -> argparse.ArgumentParser:
    """``--debug``: show the traceback of a user error (``errors``) instead of its one line."""
    parser.add_argument(
        "--debug", action="store_true", help=f"show the traceback of {errors} instead of one line"
    )
    return parser


# A word written as config keys are (OUTPUT_DIR, SOLVER.MAX_ITER): never a dataset's file.
_CONFIG_KEY = re.compile(r"[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)*")


class _CocoDatasetAction(argparse._AppendAction):
    """``--coco-dataset``'s three words, refused when one of them is a config key: a word left
    out takes the next override's key (``--coco-dataset x a.json OUTPUT_DIR out``), which would
    leave the overrides one word short."""

    def __call__(self, parser, namespace, values, option_string=None):
        for meaning, word in zip(self.metavar, values):
            if _CONFIG_KEY.fullmatch(word) and not os.path.exists(word):
                parser.error(
                    f"{option_string} {' '.join(values)}: {meaning} {word!r} is a config "
                    f"key: give {option_string} NAME JSON IMAGE_DIR, then the overrides"
                )
        super().__call__(parser, namespace, values, option_string)


def add_coco_dataset_argument(
    parser: argparse.ArgumentParser, datasets: str = "DATASETS.TRAIN / TEST"
) -> argparse.ArgumentParser:
    """``--coco-dataset NAME JSON IMAGE_DIR`` (repeatable): a COCO-format dataset to register
    under NAME (:func:`lambda_det.data.coco.register_coco_triples`), named in ``datasets``."""
    parser.add_argument(
        "--coco-dataset",
        nargs=3,
        action=_CocoDatasetAction,
        default=[],
        metavar=("NAME", "JSON", "IMAGE_DIR"),
        help=f"register a COCO-format dataset under NAME (repeatable); use NAME in {datasets}",
    )
    return parser


def add_debug_and_overrides(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--debug`` and the trailing ``KEY VALUE`` config overrides (last: they take the rest)."""
    add_debug_argument(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE ...")
    return parser


def parse_command_line(
    parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None
) -> argparse.Namespace:
    """``parser.parse_args(argv)``, where options may also follow the trailing overrides:
    argparse gives every word after the first override to ``opts``, so ``X 5 --coco-dataset a
    b c`` would merge ``--coco-dataset`` as a config key. Each of the parser's options found in
    ``opts`` is moved before them; the overrides keep their order."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = []
    required = [action for action in parser._actions if action.required]
    for action in required:  # a required option may be among the trailing words
        action.required = False
    try:
        while True:
            opts = parser.parse_args(argv).opts
            option = next(
                (
                    index
                    for index, word in enumerate(opts)
                    if word.split("=", 1)[0] in parser._option_string_actions
                ),
                None,
            )
            if option is None:
                break
            if option == 0:  # right after a tool's positionals, which argparse ended opts at
                action = parser._option_string_actions[opts[0].split("=", 1)[0]]
                taken = 1 + (
                    action.nargs
                    if isinstance(action.nargs, int)
                    else int(action.nargs is None and "=" not in opts[0])
                )
                argv = opts[:taken] + argv[: len(argv) - len(opts)] + opts[taken:]
                continue
            overrides += opts[:option]
            argv = argv[: len(argv) - len(opts)] + opts[option:]
    finally:
        for action in required:
            action.required = True
    args = parser.parse_args(argv)
    args.opts = overrides + args.opts
    return args
