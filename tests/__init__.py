"""querylab test suite (a package, so `tests.fakes` wins over any installed `tests`)."""
