#!/usr/bin/env python3
"""PTX of a kernel configuration from two flexjit builds, and where it differs.

    scripts/ptx_diff.py BEFORE_FLEXJIT AFTER_FLEXJIT [inspect arguments...]

Runs `FLEXJIT inspect ARGS` with each binary under FLEXJIT_DUMP_DIR (which keeps the generated
source and NVRTC's options), compiles each source with NVRTC for the virtual architecture
(compute_90a for sm_90a, ...) to get PTX, and prints a diff of the two with the register numbers
erased (ptxas allocates from the PTX, so a template change that keeps it keeps the SASS; the
number of virtual registers alone moves ptxas's choices a little: "registers renamed" in
scripts/sass_fingerprint.sh). Quicker than comparing SASS when looking for what a template
change moved (docs/kernels/decode.md "Code structure"). Needs libnvrtc (CUDA_HOME, default
/usr/local/cuda).

Example:
    scripts/ptx_diff.py /tmp/flexjit.before build/flexjit --kernel decode_split --arch sm_90a \\
        --mods causal --gqa 4
"""
import ctypes
import difflib
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def nvrtc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return ctypes.CDLL(os.path.join(home, "lib64", "libnvrtc.so"))


def ptx_of(lib, source_path):
    source = open(source_path, "rb").read()
    options = json.load(open(source_path[:-3] + ".json"))["options"]
    # The virtual architecture gives PTX; ptxas's own options do not apply.
    options = [o.replace("=sm_", "=compute_") for o in options if not o.startswith("--ptxas")]
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernel.cu", 0, None, None) != 0:
        sys.exit(f"{source_path}: nvrtcCreateProgram failed")
    args = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = lib.nvrtcCompileProgram(prog, len(options), args)
    size = ctypes.c_size_t()
    if status != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{source_path}: NVRTC failed:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def normalized(ptx):
    # Register numbers, labels and comments erased; declarations of register counts dropped.
    out = []
    for line in ptx.splitlines():
        if line.strip().startswith("//") or ".reg ." in line:
            continue
        line = re.sub(r"%(rd|rs|fd|r|f|p)[0-9]+", r"%\1", line)
        out.append(re.sub(r"\$L__BB[0-9_]+", "L", line))
    return out


def dump_source(binary, args):
    out = tempfile.mkdtemp(prefix="flexjit-ptx-")
    os.chmod(out, 0o700)
    env = dict(os.environ, FLEXJIT_DUMP_DIR=out, FLEXJIT_CACHE_DIR=tempfile.mkdtemp())
    subprocess.run([binary, "inspect", *args], env=env, stdout=subprocess.DEVNULL, check=True)
    sources = sorted(glob.glob(os.path.join(out, "*.cu")))
    if len(sources) != 1:
        sys.exit(f"{binary} inspect wrote {len(sources)} sources to {out}, expected one")
    return sources[0]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    lib = nvrtc()
    before, after = (normalized(ptx_of(lib, dump_source(b, sys.argv[3:]))) for b in sys.argv[1:3])
    diff = list(difflib.unified_diff(before, after, "before", "after", n=3, lineterm=""))
    print("\n".join(diff))
    changed = sum(1 for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---")))
    print(f"# {changed} PTX lines differ (of {len(before)} / {len(after)})", file=sys.stderr)


if __name__ == "__main__":
    main()
