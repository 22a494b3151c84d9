"""The eesd test kit, shipped for plug-in authors: strategies, exact oracles, contract classes.

Installed as a pytest plug-in (entry point ``pytest11: eesd``), so its fixtures and Hypothesis
profiles are available in any test suite of an environment where eesd is installed.
"""
