"""The head: the launcher's process on the machine the user types on.

It checks the config, the hosts and the task once, starts horovodrun with discovery and the
workers' environment, serves the job channel, watches spot capacity and the budget, and stops
everything on a signal. It never imports torch at module level, and nothing here runs on a
worker: horovodrun starts `python -m transientvod.worker.train` there.
"""
