"""What the scripts that drive mixtrain's programs share: messages under the script's name, a
program run with its output in a log (the log's tail shown when it fails), the programs looked up in
--bin, the working folder and the environment the runs get."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path


class Runner:
    def __init__(self, name):
        self.name = name

    def fail(self, message, code=2):
        print(f"{self.name}: {message}", file=sys.stderr)
        sys.exit(code)

    def run(self, label, argv, log_path, env, shown=None):
        """Runs a program with its output in log_path and returns that output; on failure prints the
        log's tail and exits 2."""
        print(f"{self.name}: {label}: {shown or ' '.join(str(a) for a in argv)}", flush=True)
        with open(log_path, "w") as log:
            result = subprocess.run([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        text = Path(log_path).read_text(errors="replace")
        if result.returncode != 0:
            print(f"{self.name}: {label} failed (exit status {result.returncode}); the end of {log_path}:",
                  file=sys.stderr)
            print("\n".join("  " + line for line in text.splitlines()[-30:]), file=sys.stderr)
            sys.exit(2)
        return text

    def programs(self, bin_dir, names):
        """{name: path} of the named programs in bin_dir; exits 2 naming the first one missing."""
        found = {name: Path(bin_dir) / name for name in names}
        for name, path in found.items():
            if not os.access(path, os.X_OK):
                self.fail(f"no {name} in {bin_dir} (build it, or give --bin)")
        return found

    def workdir(self, given):
        """--workdir, made if missing, or a new temporary folder."""
        work = Path(given) if given else Path(tempfile.mkdtemp(prefix=f"{self.name}."))
        work.mkdir(parents=True, exist_ok=True)
        print(f"{self.name}: working in {work}")
        return work


def program_env():
    """The environment of the runs: idle OpenMP threads sleep instead of spinning (much faster on
    small or shared machines)."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env
