"""archspec: a declarative architecture compiler for vision transformers with convolutional biases."""
