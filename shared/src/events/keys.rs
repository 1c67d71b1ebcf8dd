//! Names of a run's Redis keys and channels.

use uuid::Uuid;

/// Names of a run's Redis keys and channels.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }
    pub fn events(&self, run: Uuid) -> String {
        self.of_run(run, "events")
    }
    pub fn live(&self, run: Uuid) -> String {
        self.of_run(run, "live")
    }
    pub fn control(&self, run: Uuid) -> String {
        self.of_run(run, "control")
    }
    pub fn fence(&self, run: Uuid) -> String {
        self.of_run(run, "fence")
    }
    /// The id offset of a list rebuilt after a loss (absent: 0).
    pub fn base(&self, run: Uuid) -> String {
        self.of_run(run, "base")
    }
    /// `{prefix}:run:{run}:{name}`, built without `format!`: every append names four of these,
    /// and through the formatting machinery (a `Uuid`'s `Display` included) they cost about
    /// 2,000 instructions each, 6 % of a worker's instructions per run (callgrind).
    fn of_run(&self, run: Uuid, name: &str) -> String {
        let mut id = Uuid::encode_buffer();
        let id = run.hyphenated().encode_lower(&mut id);
        let mut key = String::with_capacity(self.prefix.len() + 6 + id.len() + name.len());
        key.push_str(&self.prefix);
        key.push_str(":run:");
        key.push_str(id);
        key.push(':');
        key.push_str(name);
        key
    }
    /// Pattern matching every run's live channel, for the API's single subscription.
    pub fn live_pattern(&self) -> String {
        format!("{}:run:*:live", self.prefix)
    }
    pub fn control_pattern(&self) -> String {
        format!("{}:run:*:control", self.prefix)
    }
    /// Extracts the run id from a live or control channel name.
    pub fn run_of_channel(&self, channel: &str) -> Option<Uuid> {
        let rest = channel.strip_prefix(&self.prefix)?.strip_prefix(":run:")?;
        let id = rest.split(':').next()?;
        Uuid::parse_str(id).ok()
    }
}
