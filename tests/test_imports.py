import subprocess
import sys


def test_importing_vmem_does_not_import_cuda_libraries():
    code = "import sys, vmem; vmem.device('cpu', memory='1MiB').close(); print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'pynvml', 'torch', 'matplotlib')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
