"""The broker's runtime is resolved from the pom shipped in the package, wherever it is run from."""

import subprocess
import sys


def test_the_pom_is_found_outside_the_repository(tmp_path):
    # Run from an empty directory: a lookup by a top-level name ("infra") only worked from the
    # repository's root, where the folder shadows the installed package.
    code = "from streamtrain.infra.kafka_broker import _pom_text; print(b'kafka_2.13' in _pom_text())"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
