# The Python package (python/quorum), as installed into .venv by
# scripts/test.sh with `pip install .`: its pytest suite (real ps tasks on
# threads, numpy and torch arrays) and mypy over its annotations.
add_test(NAME python_package
         COMMAND ${QR_VENV_PYTHON} -m pytest -q -p no:cacheprovider
                 ${PROJECT_SOURCE_DIR}/python/tests)
set_tests_properties(python_package PROPERTIES TIMEOUT 600) # 90 s in CI, 215 s on a loaded machine
add_test(NAME python_mypy
         COMMAND ${QR_VENV_PYTHON} -m mypy --config-file ${PROJECT_SOURCE_DIR}/pyproject.toml
                 --cache-dir ${PROJECT_BINARY_DIR}/mypy-cache ${PROJECT_SOURCE_DIR}/python/quorum)
set_tests_properties(python_mypy PROPERTIES TIMEOUT 300)
