"""Spot lifecycles: which transient hosts are usable now, and which are about to go.

Never imports torch or horovod: `launch/spot_hosts.py`, which Horovod runs every second,
imports from here, and so does the long-running watcher.
"""
