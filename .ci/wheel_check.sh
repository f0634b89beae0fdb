#!/usr/bin/env bash
# Build the sdist and wheel, check them, install the wheel into a fresh virtual environment
# outside the checkout and run the main job there (`make wheel-check`, part of `make test`).
#
#   .ci/wheel_check.sh VENV_PYTHON
#
# The fresh environment gets the wheel only (`pip install --no-deps`); its dependencies come
# from VENV_PYTHON's site-packages through a .pth line, so no torch download is needed. A path
# added by a .pth line is a plain sys.path entry: the .pth files in it are not run, so the
# editable install of the checkout in that environment is not active, and the wheel's own
# site-packages comes first. The script checks that `mmpos` is imported from the wheel, that
# the wheel's requirements are met (`pip check`), and runs from a folder outside the checkout.
set -euo pipefail
py=${1:?usage: .ci/wheel_check.sh VENV_PYTHON}
[ -x "$py" ] || { echo "wheel check: no python at $py"; exit 2; }
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")  # absolute, symlink kept (it names the venv)
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== build sdist + wheel (the wheel is built from the sdist)"
"$py" -m build --outdir "$tmp/dist" "$root" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
if grep -iE "^(warning|error)|SetuptoolsDeprecationWarning" "$tmp/build.log" | grep -v "byte-compiling is disabled"; then
    echo "wheel check: the build printed warnings (above)"; exit 1
fi
"$py" -m twine check --strict "$tmp"/dist/*
wheel=$(ls "$tmp"/dist/*.whl)
echo "== wheel contents: data files and licenses"
"$py" -m zipfile -l "$wheel" | awk 'NR == 1 || !/\.py /'

echo "== fresh venv outside the checkout: $tmp/venv"
"$py" -m venv --without-pip "$tmp/venv"
deps=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" >"$site/_deps_from_test_venv.pth"
"$py" -m pip --python "$tmp/venv/bin/python" install --quiet --no-deps --no-index "$wheel"
"$py" -m pip --python "$tmp/venv/bin/python" check

cd "$tmp"
for package in mmpos recipes; do  # the library and, beside it, the recipes: both from the wheel
    where=$("$tmp/venv/bin/python" -c "import $package; print($package.__file__)")
    case "$where" in
        "$site"/*) echo "$package imported from the wheel: $where" ;;
        *) echo "wheel check: $package was imported from $where, not from the installed wheel"; exit 1 ;;
    esac
done
for args in "list" "list recipes" "info" "cp quickstart my_quickstart.yaml" \
    "run quickstart profile=smoke progress=false --out $tmp/runs"; do
    echo "== (cd $tmp) mmpos $args"
    # shellcheck disable=SC2086
    "$tmp/venv/bin/mmpos" $args
done
echo "== wheel check passed"
