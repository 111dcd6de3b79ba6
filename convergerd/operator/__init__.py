"""The in-cluster operator: turns each Policy object into a ValidatingAdmissionPolicy and its
binding (`admission`, pure), and keeps them in place."""
