"""The Python face stays thin: small modules, one per concern, imports at the top (the package
is read top-down, and no method reaches back into it), and a binding per face."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "feedline"
MAX_LINES = 500


def _modules():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10, files  # the package is there, dataloader/ included
    return files


def test_no_module_is_over_500_lines():
    long = {str(f.relative_to(PACKAGE)): n for f in _modules()
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_function_imports_from_the_package():
    # The one exception: feedline/__init__.py's module __getattr__ imports DataLoader (and so
    # torch) only when it is first asked for.
    found = []
    for f in _modules():
        tree = ast.parse(f.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if f.name == "__init__.py" and f.parent == PACKAGE and fn.name == "__getattr__":
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                        node.level > 0 or (node.module or "").startswith("feedline")):
                    found.append(f"{f.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


def test_the_binding_is_one_translation_unit_per_face():
    binding = ROOT / "python"
    faces = {"bind_engine.cc", "bind_image.cc", "bind_text.cc", "bind_python.cc"}
    assert faces <= {p.name for p in binding.glob("bind_*.cc")}
    module = (binding / "feedline_module.cc").read_text()
    assert "PYBIND11_MODULE" in module and "py::class_" not in module and "m.def(" not in module
    for face in faces:
        assert len((binding / face).read_text().splitlines()) <= MAX_LINES, face
