"""The plugin is loaded by every pytest run in the environment: it must stay light."""
import subprocess
import sys

HEAVY = ("torch", "transformers", "llama_cpp", "gguf", "pyarrow", "numpy")


def test_plugin_import_pulls_in_no_heavy_module():
    code = f"import sys, pytest_modeldiff.plugin; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_collect_only_run_without_ref_model_loads_no_heavy_module(pytester):
    pytester.makeconftest(f"""
import sys
def pytest_unconfigure(config):
    print("HEAVY", [m for m in {HEAVY!r} if m in sys.modules])
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--co", "-q")
    result.stdout.fnmatch_lines(["HEAVY []"])
