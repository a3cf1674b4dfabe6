"""Pure codecs: JSON tensors, TensorProto <-> numpy, tf.Example. No I/O."""
