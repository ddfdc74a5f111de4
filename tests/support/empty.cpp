// Keeps memkit_test_support a valid library while tests/support/ has only headers.
