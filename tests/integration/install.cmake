# Installing: configuring where the C libraries are missing (a fresh
# machine running `pip install .`) names them all at once, with the
# apt-get command (CMakeLists.txt).
qr_integration_test(integration_build_missing_libraries test_build_deps.py ${CMAKE_COMMAND}
                    ${PROJECT_SOURCE_DIR})
set_tests_properties(integration_build_missing_libraries PROPERTIES TIMEOUT 300)
