"""A real cluster on one machine: namespaced hosts over SSH, servers that vanish, shaped links.

Loopback hides what a network does: no SSH, no bandwidth limit, and a killed peer's sockets
close at once. The testbed gives each host what a cloud VM has, on this machine, as root::

    transientvod testbed up --hosts 4 --bandwidth 100mbit
    transientvod testbed exec -- transientvod train --config my.yaml --discovery "..."
    transientvod testbed vanish tvd-h2      # the VM disappears: link down, processes frozen
    transientvod testbed restore tvd-h2     # a replacement server with the same name
    transientvod testbed down

Each host is a network namespace with its own address on one switch, its own hostname (a UTS
namespace), its own hosts file (Debian's: the hostname maps to 127.0.1.1, as on many real
hosts), and its own sshd listening on its address only. A head namespace runs the launcher,
discovery and the watcher, as a cluster's head node would; all share this machine's files,
as an NFS home would, except the directories given to `up --private-disk DIR`, which each host
has as an empty disk of its own. Nothing is made in the machine's own network namespace.

Modules: `layout` (names and addresses, no side effects), `record` (the state file: what was
made, so `down` removes exactly that), `network` (namespaces, veths, switch, tc), `sshd`
(keys, configs, daemons), `private_disk` (checking --private-disk), `cluster` (the verbs).
"""
from __future__ import annotations


class TestbedError(RuntimeError):
    """Something the user must fix (not root, a missing tool, bad input); one sentence."""

    __test__ = False  # not a pytest test class, despite the name
