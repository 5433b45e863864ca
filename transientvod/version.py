"""The package's version, in one place: pyproject.toml reads it (setuptools' `attr:`), and
`transientvod --version`, `transientvod.__version__` and the MLflow run tags print it."""

__version__ = "0.1.0"
