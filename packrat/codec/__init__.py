"""Request bodies to input samples and outputs to answers: forms, KServe v1 and v2 (OIP), images, text."""
