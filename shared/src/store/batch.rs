//! Group commit: the same fenced write of many runs as one statement.
//!
//! A worker holds up to `worker.concurrency` runs, and at load many of them reach the same
//! step at once (a turn to record, a tool result, the end). Each write on its own costs
//! Postgres a round trip, an executor start-up, the table's constraint expressions and a
//! commit (a WAL flush); written together they cost that once per group. The groups form by
//! themselves: a write waits only while earlier groups hold every slot (`in_flight`), so an
//! idle worker writes at once and a busy one writes larger groups — no timer, no added
//! latency when there is nothing to group with.
//!
//! Each item still carries its own fence, and the statement reports which items' fences held
//! (or, for a write that answers with rows, the row of each item). If the group's statement
//! fails, every item is written again on its own, so one item's bad data (a constraint) fails
//! only that item, with its own error.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::StoreError;

type Reply<R> = oneshot::Sender<Result<R, StoreError>>;

/// Writes `items` in one statement; per item, in order, what it answers (for a fenced write:
/// whether its fence held).
pub type WriteFn<T, R = bool> = Arc<
    dyn Fn(PgPool, Arc<Vec<T>>) -> Pin<Box<dyn Future<Output = Result<Vec<R>, StoreError>> + Send>>
        + Send
        + Sync,
>;

/// A handle to one kind of grouped write; cheap to clone.
pub struct Batcher<T, R = bool> {
    tx: mpsc::UnboundedSender<(T, Reply<R>)>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Batcher {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Send + Sync + 'static, R: Send + 'static> Batcher<T, R> {
    /// Starts the grouping task; it ends when the last handle is dropped. At most `in_flight`
    /// groups are written at once, each of at most `max_items`.
    pub fn spawn(pool: PgPool, in_flight: usize, max_items: usize, write: WriteFn<T, R>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(group(rx, pool, in_flight.max(1), max_items.max(1), write));
        Batcher { tx }
    }

    /// Writes `item` with whatever else is waiting (for a fenced write, `Ok(false)`: its fence
    /// did not hold).
    pub async fn write(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .map_err(|_| StoreError::Db(sqlx::Error::PoolClosed))?;
        answer
            .await
            .map_err(|_| StoreError::Db(sqlx::Error::WorkerCrashed))?
    }
}

async fn group<T: Send + Sync + 'static, R: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<(T, Reply<R>)>,
    pool: PgPool,
    in_flight: usize,
    max_items: usize,
    write: WriteFn<T, R>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    loop {
        // A slot first: while every slot is busy, items wait in the channel and form a group.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut items = vec![first];
        while items.len() < max_items {
            match rx.try_recv() {
                Ok(item) => items.push(item),
                Err(_) => break,
            }
        }
        let (pool, write) = (pool.clone(), write.clone());
        tokio::spawn(async move {
            write_group(&pool, &write, items).await;
            drop(slot);
        });
    }
}

async fn write_group<T, R>(pool: &PgPool, write: &WriteFn<T, R>, items: Vec<(T, Reply<R>)>) {
    metrics::histogram!("agentfleet_store_group_size").record(items.len() as f64);
    let (items, replies): (Vec<T>, Vec<Reply<R>>) = items.into_iter().unzip();
    let items = Arc::new(items);
    match write(pool.clone(), items.clone()).await {
        Ok(answers) => {
            debug_assert_eq!(answers.len(), replies.len(), "one answer per item");
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Err(e) if replies.len() == 1 => {
            let _ = replies.into_iter().next().expect("one").send(Err(e));
        }
        Err(e) => {
            tracing::debug!(error = %e, items = replies.len(), "grouped write failed; writing its items one by one");
            let Ok(items) = Arc::try_unwrap(items) else {
                // The write function kept the items: not ours to split, so all fail alike.
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Db(sqlx::Error::WorkerCrashed)));
                }
                return;
            };
            for (item, reply) in items.into_iter().zip(replies) {
                let result = write(pool.clone(), Arc::new(vec![item]))
                    .await
                    .and_then(|a| {
                        a.into_iter()
                            .next()
                            .ok_or(StoreError::Db(sqlx::Error::RowNotFound))
                    });
                let _ = reply.send(result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Items wait while every slot is busy and are then written as one group; when a group
    /// fails, its items are written one by one, so only the bad item fails.
    #[tokio::test(flavor = "current_thread")]
    async fn waiting_items_form_a_group_and_a_failed_group_is_split() {
        let pool = PgPool::connect_lazy("postgres://unused@127.0.0.1:1/none").unwrap();
        let gate = Arc::new(tokio::sync::Notify::new());
        let groups: Arc<Mutex<Vec<Vec<u32>>>> = Default::default();
        let (gate2, groups2) = (gate.clone(), groups.clone());
        let write: WriteFn<u32> = Arc::new(move |_pool, items: Arc<Vec<u32>>| {
            let (gate, groups) = (gate2.clone(), groups2.clone());
            Box::pin(async move {
                let first = groups.lock().unwrap().is_empty();
                groups.lock().unwrap().push(items.to_vec());
                if first {
                    gate.notified().await; // holds the only slot until the test lets go
                }
                if items.contains(&13) {
                    return Err(StoreError::NotFound);
                }
                Ok(items.iter().map(|i| i % 2 == 0).collect())
            })
        });
        let batcher = Batcher::spawn(pool, 1, 64, write);
        let spawn = |i: u32| {
            let b = batcher.clone();
            tokio::spawn(async move { (i, b.write(i).await) })
        };
        let mut tasks = vec![spawn(1)];
        while groups.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // The first group holds the only slot: these wait in the channel.
        tasks.extend([2, 13, 4, 5].map(spawn));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        for task in tasks {
            let (i, result) = task.await.unwrap();
            match i {
                13 => assert!(matches!(result, Err(StoreError::NotFound))),
                _ => assert_eq!(result.unwrap(), i % 2 == 0, "item {i}"),
            }
        }
        let groups = groups.lock().unwrap().clone();
        assert_eq!(groups[0], [1], "the first item is written at once");
        assert_eq!(
            groups[1],
            [2, 13, 4, 5],
            "the others waited and formed one group"
        );
        assert_eq!(
            &groups[2..],
            [[2], [13], [4], [5]],
            "the failed group was split"
        );
    }
}
