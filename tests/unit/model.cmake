# Unit tests of src/model (gradients), src/data (the loaders) and the
# initializers of src/common/init.c, and a short end-to-end training run on
# the digits.
qr_unit_test(test_model_grad ${CMAKE_CURRENT_LIST_DIR}/test_model_grad.c)
qr_unit_test(test_data_loaders ${CMAKE_CURRENT_LIST_DIR}/test_data_loaders.c)
qr_unit_test(test_model_train ${CMAKE_CURRENT_LIST_DIR}/test_model_train.c)
