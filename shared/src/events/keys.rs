//! Names of a run's Redis keys and channels.
//!
//! Every key and channel of one run carries the run's id as a hash tag
//! (`{prefix}:run:{<id>}:events`): a Redis Cluster keeps them in one hash slot, so the append
//! script can name the list, its fence and its id base and publish on the run's sharded channel
//! in one atomic step. A thread's channel is tagged with the thread's id.

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
        self.of(":run:", run, "events")
    }
    /// The run's live channel: each appended event, as stored.
    pub fn live(&self, run: Uuid) -> String {
        self.of(":run:", run, "live")
    }
    pub fn control(&self, run: Uuid) -> String {
        self.of(":run:", run, "control")
    }
    pub fn fence(&self, run: Uuid) -> String {
        self.of(":run:", run, "fence")
    }
    /// The id offset of a list rebuilt after a loss (absent: 0).
    pub fn base(&self, run: Uuid) -> String {
        self.of(":run:", run, "base")
    }
    /// The thread's channel: the id of each run of the thread as it is queued or started, for
    /// thread streams waiting for the thread's next run.
    pub fn thread_live(&self, thread: Uuid) -> String {
        self.of(":thread:", thread, "live")
    }
    /// `{prefix}{kind}{<id>}:{name}`, built without `format!`: every append names four of
    /// these, and through the formatting machinery (a `Uuid`'s `Display` included) they cost
    /// about 2,000 instructions each, 6 % of a worker's instructions per run (callgrind).
    fn of(&self, kind: &str, id: Uuid, name: &str) -> String {
        let mut buf = Uuid::encode_buffer();
        let id = id.hyphenated().encode_lower(&mut buf);
        let mut key =
            String::with_capacity(self.prefix.len() + kind.len() + id.len() + 3 + name.len());
        key.push_str(&self.prefix);
        key.push_str(kind);
        key.push('{');
        key.push_str(id);
        key.push_str("}:");
        key.push_str(name);
        key
    }
    /// Pattern matching every run's control channel, for a worker's one subscription.
    pub fn control_pattern(&self) -> String {
        format!("{}:run:*:control", self.prefix)
    }
    /// The run (or thread) id of a channel of [`Keys`]'s making.
    pub fn id_of_channel(&self, channel: &str) -> Option<Uuid> {
        let rest = channel.strip_prefix(&self.prefix)?;
        let rest = rest
            .strip_prefix(":run:")
            .or_else(|| rest.strip_prefix(":thread:"))?;
        let id = rest.strip_prefix('{')?.split('}').next()?;
        Uuid::parse_str(id).ok()
    }
    /// Whether `channel` is a thread's channel (else a run's).
    pub fn is_thread_channel(&self, channel: &str) -> bool {
        channel
            .strip_prefix(&self.prefix)
            .is_some_and(|rest| rest.starts_with(":thread:"))
    }
}
