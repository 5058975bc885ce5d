"""One round: the cycle every round of either loop goes through (``cycle``), the round's
scope behind ``RoundContext`` (``scope``), checking a Declaration (``declaration``), and
materializing it with as few Spark jobs as its plan allows (``materialize``).

Imports every other runtime package; nothing in the runtime imports it but itself."""
