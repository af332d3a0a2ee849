"""Tests of lazymath.viz (a package, so its conftest never takes the bare name `conftest`
that other test folders import helpers from)."""
