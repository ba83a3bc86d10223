#!/bin/sh
# Installs plexus_torch the two documented ways and checks that the installed copy (not the build
# tree's) is what Python imports:
#   venv SOURCE_DIR BUILD_DIR PYTHON VENV   python -m venv --system-site-packages VENV, then
#                                           VENV/bin/pip install SOURCE_DIR/python, reusing
#                                           BUILD_DIR's compiled extension (BUILD_DIR "-": pip
#                                           builds it from scratch); nothing is downloaded
#   cmake BUILD_DIR PYTHON PREFIX           cmake --install BUILD_DIR --component torch_python
set -eu
mode=$1
check_import() {  # PYTHON EXPECTED_DIR
  location=$(cd / && "$1" -c "import plexus_torch, os; print(os.path.dirname(plexus_torch.__file__))")
  case "$location" in
    "$2"*) echo "plexus_torch imports from $location" ;;
    *) echo "FAILED: plexus_torch imports from $location, not from $2" >&2; exit 1 ;;
  esac
}
case "$mode" in
  venv)
    src=$2 build=$3 python=$4 venv=$5
    rm -rf "$venv"
    "$python" -m venv --system-site-packages "$venv"
    if [ "$build" != "-" ]; then export PLEXUS_BUILD_DIR="$build"; fi
    "$venv/bin/pip" install --no-index --no-deps --no-cache-dir --no-build-isolation \
      --disable-pip-version-check --quiet "$src/python"
    unset PYTHONPATH
    check_import "$venv/bin/python" "$venv/"
    ;;
  cmake)
    build=$2 python=$3 prefix=$4
    rm -rf "$prefix"
    cmake --install "$build" --component torch_python --prefix "$prefix"
    dir=$(sed -n 's/^PLEXUS_PYTHON_INSTALL_DIR:STRING=//p' "$build/CMakeCache.txt")
    export PYTHONPATH="$prefix/$dir"
    check_import "$python" "$prefix/$dir/"
    ;;
  *) echo "usage: install_test.sh venv SOURCE BUILD PYTHON VENV | cmake BUILD PYTHON PREFIX" >&2
     exit 2 ;;
esac
