"""Private disks: directories each host sees as its own, as separate VMs share no file system.

The testbed's hosts otherwise share this machine's files, which hides whatever a job assumes
about a shared disk. For each DIR given to `up --private-disk`, every host's sshd starts in a
mount namespace of its own with a fresh tmpfs over DIR, so what a host's processes (all children
of that sshd) write under DIR no other host sees, nor the head, which keeps this machine's real
DIR. Everything outside DIR stays shared. The tmpfs lives as long as the host's processes: `kill`,
`restore` and `down` end them, and with them the mount namespace; nothing enters this machine's
own mount table, and a restored host starts with an empty DIR, as a new VM has an empty disk.
"""
from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from transientvod.testbed import TestbedError
from transientvod.testbed.record import RUN_ROOT
from transientvod.testbed.sshd import SSHD

# transientvod and the folders setup.py maps into it: inside the package in a wheel, but in the
# checkout (launch/, configs/, csrc/) in an editable install; the hosts need all of them.
PACKAGES = ("transientvod", "transientvod.launch", "transientvod.configs", "transientvod.csrc")


def prepare(directories: list[str] | tuple[str, ...]) -> list[str]:
    """Each DIR made absolute, checked and created; TestbedError (one sentence) for one the hosts
    could not have as their own."""
    # What a host needs from this machine's disk to run the job; a private DIR must not hide it.
    needed = {"the testbed's state directory": RUN_ROOT,
              **{f"the package {name}": Path(str(resources.files(name))) for name in PACKAGES},
              "the Python environment": Path(sys.prefix), "sshd": Path(SSHD)}
    prepared = []
    for given in directories:
        path = Path(given).expanduser().resolve()
        if path == Path("/"):
            raise TestbedError(f"--private-disk {given} would hide this machine's whole disk from the hosts; "
                               "give a directory of its own, for example /scratch.")
        if path.exists() and not path.is_dir():
            raise TestbedError(f"--private-disk {given} is not a directory; give a directory (it is made if missing).")
        for what, thing in needed.items():
            thing = thing.resolve()
            if thing == path or path in thing.parents:
                raise TestbedError(f"--private-disk {given} holds {what} ({thing}), which the hosts need; "
                                   "give a directory outside it.")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TestbedError(f"--private-disk {given} could not be made ({e.strerror}); give a directory "
                               "that can be.") from None
        if str(path) not in prepared:
            prepared.append(str(path))
    return prepared
