# The Python package (python/quorum), as installed into .venv by
# scripts/test.sh with `pip install .`: its pytest suite (real ps tasks on
# threads, numpy and torch arrays) and mypy over its annotations.
add_test(NAME python_package
         COMMAND ${QR_VENV_PYTHON} -m pytest -q -p no:cacheprovider
                 --ignore=${PROJECT_SOURCE_DIR}/python/tests/test_real_scripts.py
                 ${PROJECT_SOURCE_DIR}/python/tests)
# The package pip builds is not a sanitizer build: the sanitizer pass
# (scripts/test.sh --sanitize skips the label `unsanitized`) would run the
# same code a second time.
set_tests_properties(python_package PROPERTIES TIMEOUT 900 LABELS unsanitized)
# A real PyTorch script and its quorum twin, trained alone and under
# `quorum launch`, sync and async, float32 and bf16 (twelve trainings):
# apart, and left out of the sanitizer pass, as the other slow tests.
add_test(NAME python_real_scripts
         COMMAND ${QR_VENV_PYTHON} -m pytest -q -p no:cacheprovider -s
                 ${PROJECT_SOURCE_DIR}/python/tests/test_real_scripts.py)
set_tests_properties(python_real_scripts PROPERTIES TIMEOUT 1800 LABELS slow)
add_test(NAME python_mypy
         COMMAND ${QR_VENV_PYTHON} -m mypy --config-file ${PROJECT_SOURCE_DIR}/pyproject.toml
                 --cache-dir ${PROJECT_BINARY_DIR}/mypy-cache ${PROJECT_SOURCE_DIR}/python/quorum)
set_tests_properties(python_mypy PROPERTIES TIMEOUT 300 LABELS unsanitized)
