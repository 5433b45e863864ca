"""`transientvod install-horovod`: build (once, cached) and install the patched Horovod for this Python."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources

from transientvod.config import ConfigError

# Shipped inside the package (launch/ of the checkout; see setup.py), so that an installed
# wheel builds Horovod without a checkout.
INSTALL_HOROVOD = resources.files("transientvod.launch") / "install_horovod.sh"


def add_parser(subparsers) -> None:
    install_horovod = subparsers.add_parser("install-horovod", help="build (cached) and install the patched Horovod "
                                            "for this Python and its torch (HOROVOD_SDIST=FILE: without PyPI)")
    install_horovod.add_argument("--wheel-path", action="store_true",
                                 help="print only the cached wheel's path (to upload for fleet --horovod-wheel)")
    install_horovod.set_defaults(func=cmd_install_horovod)


def cmd_install_horovod(args) -> int:
    """Build (once per torch build and Python, cached) and install the patched Horovod into this
    Python's environment: the packaged launch/install_horovod.sh, run with this interpreter."""
    with resources.as_file(INSTALL_HOROVOD) as script:
        try:
            env = dict(os.environ, PYTHON=sys.executable, WHEEL_PATH_ONLY="1" if args.wheel_path else "")
            return subprocess.run(["bash", str(script)], env=env).returncode
        except FileNotFoundError:
            raise ConfigError("install-horovod runs a bash script and bash is not installed; install bash.") from None
