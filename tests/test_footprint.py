"""What `import npurun` costs a process: the corpus's peak-RSS goal (issue J) compares whole
processes with ONNX Runtime's, and a module loaded for one rarely used call is paid by every
run. asyncio (with the ssl it loads: ~6 MB) is for `Executor.run`'s await only; hashlib
(OpenSSL's libcrypto: 3.5 MB) was for a recording's check of its constants (zlib does it)."""
import subprocess
import sys


def test_import_npurun_loads_neither_asyncio_nor_openssl():
    code = ("import sys, npurun\n"
            "print(sorted(m for m in ('asyncio', 'ssl', '_ssl', '_hashlib', 'hashlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
