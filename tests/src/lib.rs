//! Shared helpers of the test-bed tests (being written).
