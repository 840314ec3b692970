"""pip install ./python: builds gemma4/_gemma4.so from gemma4.h and gemma4_processing.h with the system C
compiler (gemma4/_build.py: $CC, default cc; $GEMMA4_CFLAGS, default
-O2 -march=native) and installs it inside the package. The headers are found in
$GEMMA4_SOURCE or in this directory's parent (the repository root). Metadata is
in pyproject.toml."""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def _builder():
    spec = importlib.util.spec_from_file_location("gemma4_build", os.path.join(HERE, "gemma4", "_build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildWithLibrary(build_py):
    """build_py, then cc: the shared library next to the package's modules."""

    def run(self):
        super().run()
        b = _builder()
        header = b.find_header_dir([HERE, os.path.dirname(HERE)])
        if not header:
            raise SystemExit("gemma4: cannot find gemma4.h: set GEMMA4_SOURCE to the repository root")
        out = os.path.join(self.build_lib, "gemma4", b.LIB_NAME)
        b.build(out, header, verbose=True)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel holds a compiled library: tag it for this platform
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
