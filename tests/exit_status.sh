#!/usr/bin/env bash
# Runs a command and prints its exit status after its output. CTest ignores a test's exit status
# when the test has a PASS_REGULAR_EXPRESSION, so a program that printed what was expected and then
# crashed (or exited non-zero) would pass; the tests in tests/CMakeLists.txt that match output run
# their command through this script and end their expression with the status they expect.
"$@"
echo "[exit status $?]"
