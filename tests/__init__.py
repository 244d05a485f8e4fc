"""The test suite: unit/ (one folder per subpackage of pytest_modeldiff), integration/ (the plugin
through pytester, the CLI, the API, the README), conversions/ (end to end on llama.cpp conversions
of the tiny and real-model sets). Shared fixtures: conftest.py; the test models: fixtures/."""
