//! TESSERA tile grid geometry (being written).
