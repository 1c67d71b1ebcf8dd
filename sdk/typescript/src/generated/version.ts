// Written by scripts/sdk-generate: the api crate's version.
export const VERSION = "0.1.0";
