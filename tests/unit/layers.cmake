# The include graph between source folders points only down the layer
# order written at the top of scripts/check_layers.sh: an include that
# points up or sideways fails this test.
add_test(NAME check_layers COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/check_layers.sh
                                        ${PROJECT_SOURCE_DIR})
set_tests_properties(check_layers PROPERTIES TIMEOUT 60)
