"""The discovery scripts Horovod runs and the Horovod build, shipped as `transientvod.launch`.

From a checkout: `python launch/spot_hosts.py ...`; installed: `python -m transientvod.launch.spot_hosts ...`
(setup.py maps this folder into the package; install_horovod.sh and its patch are package data).
"""
