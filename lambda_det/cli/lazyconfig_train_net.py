"""The command line of tools/lazyconfig_train_net.py: tools/train_net.py's
(:func:`lambda_det.cli.train_net.main`) for LazyConfig recipes
(:data:`~lambda_det.cli.train_net.LAZY_CONFIGS`; docs/lazyconfig.md)."""

import sys
from typing import Optional, Sequence

from lambda_det.cli.train_net import LAZY_CONFIGS
from lambda_det.cli.train_net import main as train_net_main

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """tools/lazyconfig_train_net.py: returns the exit status."""
    return train_net_main(argv, system=LAZY_CONFIGS)


if __name__ == "__main__":  # python -m lambda_det.cli.lazyconfig_train_net
    sys.exit(main())
