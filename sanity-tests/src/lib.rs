//! Shared harness for the conformance suite (see tests/).
