"""Configs shipped as `transientvod.configs` (package data, read through importlib.resources),
so that `transientvod demo` runs from an installed wheel; setup.py maps this folder into the package."""
