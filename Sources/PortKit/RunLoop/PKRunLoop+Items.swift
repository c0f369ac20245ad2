// Adding and removing a loop's items (sources, timers, observers) in modes, common modes
// included, and keeping epoll's interest list in step with the running mode.

extension PKRunLoop {
    // MARK: - Common modes

    /// Adds `mode` to the loop's common modes: every item in `.common` joins it
    /// (`CFRunLoopAddCommonMode`). Loop-only.
    public func addCommonMode(_ mode: PKRunLoopMode) {
        assertOwner("addCommonMode(_:)")
        precondition(mode != .common, "PKRunLoop.addCommonMode: .common is not a real mode")
        guard commonModes.insert(mode).inserted else { return }
        for source in commonItems.customSources.values where source.isValid { insert(source, into: mode) }
        for timer in commonItems.timers.values where timer.isValid { insert(timer, into: mode) }
        for observer in commonItems.observers { insert(observer, into: mode) }
        for token in commonItems.descriptorTokens {
            if let source = descriptorSource(token) { insert(source, into: mode) }
        }
    }

    /// The loop's common modes. Loop-only.
    public var allCommonModes: Set<PKRunLoopMode> {
        assertOwner("allCommonModes")
        return commonModes
    }

    /// Calls `body` with each real mode `mode` stands for: itself, or each common mode. No
    /// array is made for the usual single mode (one was an allocation per add and remove).
    @inline(__always)
    private func forEachResolved(_ mode: PKRunLoopMode, _ body: (PKRunLoopMode) -> Void) {
        if mode == .common {
            for common in commonModes { body(common) }
        } else {
            body(mode)
        }
    }

    // MARK: - Custom sources

    /// Adds a custom source to `mode` (`CFRunLoopAddSource`); its `schedule` routine runs now.
    /// Loop-only. A source belongs to one loop.
    public func add(_ source: PKCustomSource, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard source.isValid else { return }
        precondition(source.loop == nil || source.loop === self, "PKRunLoop.add: a custom source belongs to one run loop")
        source.loop = self
        if source.addedSequence == 0 {
            nextAddedSequence += 1
            source.addedSequence = nextAddedSequence
        }
        if mode == .common { commonItems.customSources[ObjectIdentifier(source)] = source }
        forEachResolved(mode) { m in insert(source, into: m) }
        // Invalidated meanwhile: by another thread before it could see this loop (it queued
        // nothing), or taken by a purge in a nested run of a schedule routine before it reached
        // every mode. Queued now, so that the next purge takes it out of them all.
        if !source.isValid { noteInvalidated(source) }
    }

    /// Removes a custom source from `mode`; its `cancel` routine runs now. Loop-only.
    public func remove(_ source: PKCustomSource, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        let key = ObjectIdentifier(source)
        if mode == .common { commonItems.customSources[key] = nil }
        forEachResolved(mode) { m in
            guard let items = record(m), items.customSources.removeValue(forKey: key) != nil else { return }
            source.modes.removeAll { $0 == m }
            source.cancelled(on: self, mode: m)
        }
    }

    /// Whether `mode` contains `source` (for `.common`: whether it was added to the common
    /// modes, as `CFRunLoopContainsSource` answers); never an invalidated one. Loop-only.
    public func contains(_ source: PKCustomSource, inMode mode: PKRunLoopMode) -> Bool {
        assertOwner("contains(_:inMode:)")
        return source.isValid && itemsAsked(of: mode)?.customSources[ObjectIdentifier(source)] != nil
    }

    /// What `contains` looks in: the common items for `.common` (which no run has a record
    /// of), else `mode`'s record.
    private func itemsAsked(of mode: PKRunLoopMode) -> ModeRecord? {
        mode == .common ? commonItems : record(mode)
    }

    private func insert(_ source: PKCustomSource, into mode: PKRunLoopMode) {
        let items = recordMaking(mode)
        let key = ObjectIdentifier(source)
        guard items.customSources[key] == nil else { return }
        items.customSources[key] = source
        source.modes.append(mode)
        if source.isSignalled { noteSignalled(source) }
        source.scheduled(on: self, mode: mode)
    }

    // MARK: - Timers

    /// Adds a timer to `mode` (`-[NSRunLoop addTimer:forMode:]`, `CFRunLoopAddTimer`). Loop-only.
    /// A timer belongs to one loop; adding an invalid timer does nothing.
    public func add(_ timer: PKTimer, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard timer.isValid else { return }
        precondition(timer.loop == nil || timer.loop === self, "PKRunLoop.add: a timer belongs to one run loop")
        timer.loop = self
        if mode == .common { commonItems.timers[ObjectIdentifier(timer)] = timer }
        forEachResolved(mode) { m in insert(timer, into: m) }
        // Invalidated by another thread before it could see this loop (it counted nothing):
        // counted now, so that the next purge takes it out.
        if !timer.isValid {
            noteTimersChanged()
            noteInvalidation()
        }
        if let currentMode { armTimer(for: currentMode) } else { armHostedBetweenPasses(mode) }
    }

    /// Removes a timer from `mode` without invalidating it. Loop-only.
    public func remove(_ timer: PKTimer, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        let key = ObjectIdentifier(timer)
        if mode == .common { commonItems.timers[key] = nil }
        forEachResolved(mode) { m in record(m)?.timers[key] = nil }
        noteTimersChanged()
    }

    /// Whether `mode` contains `timer` (for `.common`: whether it was added to the common
    /// modes, as `CFRunLoopContainsTimer` answers); never an invalidated one. Loop-only.
    public func contains(_ timer: PKTimer, inMode mode: PKRunLoopMode) -> Bool {
        assertOwner("contains(_:inMode:)")
        return timer.isValid && itemsAsked(of: mode)?.timers[ObjectIdentifier(timer)] != nil
    }

    /// Makes a timer, adds it to `mode` and returns it
    /// (`+[NSTimer scheduledTimerWithTimeInterval:repeats:block:]`). Loop-only.
    @discardableResult
    public func scheduleTimer(
        after interval: Duration, repeats: Bool = false, tolerance: Duration = .zero,
        forMode mode: PKRunLoopMode = .default, handler: @escaping (PKTimer) -> Void
    ) -> PKTimer {
        let timer = PKTimer(fireDate: .after(interval), interval: repeats ? interval : nil, tolerance: tolerance, handler: handler)
        add(timer, forMode: mode)
        return timer
    }

    private func insert(_ timer: PKTimer, into mode: PKRunLoopMode) {
        let items = recordMaking(mode)
        let key = ObjectIdentifier(timer)
        guard items.timers[key] == nil else { return }
        items.timers[key] = timer
        if timer.addedSequence == 0 {
            nextAddedSequence += 1
            timer.addedSequence = nextAddedSequence
        }
        noteTimersChanged()
    }

    // MARK: - Observers

    /// Adds an observer to `mode` (`CFRunLoopAddObserver`). Loop-only. An observer belongs to
    /// one loop, as a timer does (`CFRunLoopObserver`: one run loop at a time).
    public func add(_ observer: PKRunLoopObserver, forMode mode: PKRunLoopMode) {
        assertOwner("add(_:forMode:)")
        guard observer.isValid else { return }
        precondition(observer.loop == nil || observer.loop === self, "PKRunLoop.add: an observer belongs to one run loop")
        observer.loop = self
        if mode == .common, !commonItems.observers.contains(where: { $0 === observer }) {
            commonItems.observers.append(observer)
        }
        forEachResolved(mode) { m in insert(observer, into: m) }
    }

    /// Removes an observer from `mode`. Loop-only.
    public func remove(_ observer: PKRunLoopObserver, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        if mode == .common { commonItems.observers.removeAll { $0 === observer } }
        forEachResolved(mode) { m in
            guard let items = record(m) else { return }
            items.observers.removeAll { $0 === observer }
            items.observersChanged()
        }
    }

    private func insert(_ observer: PKRunLoopObserver, into mode: PKRunLoopMode) {
        let items = recordMaking(mode)
        guard !items.observers.contains(where: { $0 === observer }) else { return }
        let index = items.observers.firstIndex { $0.order > observer.order } ?? items.observers.endIndex
        items.observers.insert(observer, at: index)
        items.observersChanged()
    }

    // MARK: - Descriptor sources

    /// Adds a descriptor source to `mode`. Loop-only. A source belongs to one loop.
    ///
    /// - Throws: `PKError` if epoll refuses the descriptor (for example, a regular file).
    public func add(_ source: PKDescriptorSource, forMode mode: PKRunLoopMode) throws(PKError) {
        assertOwner("add(_:forMode:)")
        precondition(source.isValid, "PKRunLoop.add: the descriptor source was invalidated")
        precondition(source.loop == nil || source.loop === self, "PKRunLoop.add: a descriptor source belongs to one run loop")
        // The loop's own epoll descriptor first: out of descriptors, the add throws and the
        // source is left as it was, to be added again later.
        _ = try epollFD()
        if source.loop == nil {
            source.loop = self
            source.token = takeSlot(for: source)
        }
        if mode == .common { commonItems.descriptorTokens.insert(source.token) }
        forEachResolved(mode) { m in insert(source, into: m) }
        // Watch it now unless the loop runs a mode the source is not in: a loop that is not
        // running may be hosted through `descriptor`, which must become readable for it, and
        // epoll's refusal is reported here, by this call.
        let watchedNow = currentMode.map { source.isIn($0) } ?? true
        if watchedNow, source.registeredEvents == nil {
            do throws(PKError) {
                try register(source)
            } catch {
                removeDescriptorSourceEverywhere(source)
                throw error
            }
        }
        // Not registered (another mode runs, or `events` is empty): the next pass in one of its
        // modes registers it. Epoll is asked now whether it takes the descriptor (an add and a
        // remove), so that a refusal is this call's error, not the source's invalidation later.
        if source.registeredEvents == nil {
            do throws(PKError) {
                let epoll = try epollFD()
                try Epoll.add(epoll, source.descriptor, events: 0, token: source.token)
                Epoll.remove(epoll, source.descriptor)
            } catch {
                removeDescriptorSourceEverywhere(source)
                throw error
            }
            parkedSources.insert(source.token)
        }
    }

    /// Removes a descriptor source from `mode` (`CFRunLoopRemoveSource`). Removed from its last
    /// mode, the source stays valid and belongs to this loop: epoll stops watching it until it
    /// is added to a mode again. Only `invalidate()` (or the thread's end) ends it. Loop-only.
    public func remove(_ source: PKDescriptorSource, forMode mode: PKRunLoopMode) {
        assertOwner("remove(_:forMode:)")
        guard source.loop === self else { return }
        if mode == .common { commonItems.descriptorTokens.remove(source.token) }
        forEachResolved(mode) { m in
            source.modes.removeAll { $0 == m }
            record(m)?.descriptorTokens.remove(source.token)
        }
        if source.modes.isEmpty {
            unregister(source)
            parkedSources.insert(source.token)
        }
    }

    func removeDescriptorSourceEverywhere(_ source: PKDescriptorSource) {
        assertOwner("invalidate()")
        unregister(source)
        for m in source.modes { record(m)?.descriptorTokens.remove(source.token) }
        commonItems.descriptorTokens.remove(source.token)
        source.modes = []
        parkedSources.remove(source.token)
        releaseSlot(of: source)
        source.markInvalid()
    }

    private func insert(_ source: PKDescriptorSource, into mode: PKRunLoopMode) {
        if !source.isIn(mode) { source.modes.append(mode) }
        recordMaking(mode).descriptorTokens.insert(source.token)
    }

    /// A slot for a new descriptor source, and its token.
    private func takeSlot(for source: PKDescriptorSource) -> UInt64 {
        let slot: Int
        if let free = freeSlots.popLast() {
            slot = free
            descriptorSlots[slot] = source
        } else {
            slot = descriptorSlots.count
            descriptorSlots.append(source)
        }
        // 31 bits: the high bit of a token marks a blocked write.
        let generation = nextGeneration & 0x7FFF_FFFF
        nextGeneration += 1
        return generation << 32 | UInt64(slot) + Token.firstSource
    }

    private func releaseSlot(of source: PKDescriptorSource) {
        guard descriptorSource(source.token) === source else { return }
        let slot = Int(source.token & 0xFFFF_FFFF - Token.firstSource)
        descriptorSlots[slot] = nil
        freeSlots.append(slot)
    }

    /// The source a token names, if it is still in the loop.
    @inline(__always)
    func descriptorSource(_ token: UInt64) -> PKDescriptorSource? {
        let low = token & 0xFFFF_FFFF
        guard low >= Token.firstSource else { return nil }
        let slot = Int(low - Token.firstSource)
        guard slot < descriptorSlots.count, let source = descriptorSlots[slot], source.token == token else { return nil }
        return source
    }

    func register(_ source: PKDescriptorSource) throws(PKError) {
        guard let mask = source.epollMask else { return }
        if source.registeredEvents == nil {
            try Epoll.add(try epollFD(), source.descriptor, events: mask, token: source.token)
        } else if source.registeredEvents != mask {
            try Epoll.modify(try epollFD(), source.descriptor, events: mask, token: source.token)
        }
        source.registeredEvents = mask
    }

    func unregister(_ source: PKDescriptorSource) {
        guard source.registeredEvents != nil else { return }
        Epoll.remove(epollDescriptor.load(ordering: .acquiring), source.descriptor)  // registered, so made
        source.registeredEvents = nil
    }

    func descriptorEventsChanged(_ source: PKDescriptorSource) {
        assertOwner("PKDescriptorSource.events")
        guard source.registeredEvents != nil else {
            // Parked, and now watching something: registered at once if the loop runs one of
            // its modes or none (a hosted loop's `descriptor` must become readable for it
            // between the host's passes), else by the next pass in one of its modes.
            guard source.epollMask != nil, !source.modes.isEmpty, currentMode.map({ source.isIn($0) }) ?? true else { return }
            parkedSources.remove(source.token)
            do throws(PKError) { try register(source) } catch {
                // It was accepted once (`add` asked epoll): the descriptor changed under us.
                removeDescriptorSourceEverywhere(source)
            }
            return
        }
        if source.epollMask == nil {
            unregister(source)
            parkedSources.insert(source.token)
        } else {
            do throws(PKError) { try register(source) } catch {
                preconditionFailure("PortKit bug: epoll refused a change of events on a registered descriptor: \(error)")
            }
        }
    }

    func registerParkedSources(for mode: PKRunLoopMode) {
        // Out of descriptors for the loop's own epoll descriptor: they stay parked, and the
        // next pass tries again (the failure is not theirs).
        guard (try? epollFD()) != nil else { return }
        for token in parkedSources {
            guard let source = descriptorSource(token) else { parkedSources.remove(token); continue }
            guard source.isIn(mode), source.epollMask != nil else { continue }
            parkedSources.remove(token)
            do throws(PKError) { try register(source) } catch {
                // It was accepted once; a failure now means the descriptor changed under us.
                removeDescriptorSourceEverywhere(source)
            }
        }
    }

    // MARK: - Emptiness

    /// Drops invalidated timers and observers from `mode`, and invalidated custom sources
    /// from every mode, calling their `cancel` routines. Inlined: a run asks as it starts and
    /// a pass up to twice, and almost always nothing was invalidated since the mode's last
    /// purge (two loads answer).
    @inline(__always)
    func purgeInvalid(_ items: ModeRecord) {
        let count = invalidationCount
        if items.purgedAt != count { purge(items, at: count) }
    }

    /// `purgeInvalid` once something may have been invalidated since the mode's last purge
    /// (`count`, the value of `invalidations`, differs from its `purgedAt`).
    @inline(never)
    private func purge(_ items: ModeRecord, at count: UInt64) {
        items.purgedAt = count
        removeInvalidatedSources()
        let itemCount = itemInvalidationCount
        if itemCount != itemsPurgedAt {
            // Every mode's, at once, as `CFRunLoopTimerInvalidate` removes a timer from all.
            itemsPurgedAt = itemCount
            for record in modeItems.values where record !== items { removeInvalidItems(record) }
        }
        removeInvalidItems(items)
        removeInvalid(&commonItems.timers)
        commonItems.observers.removeAll { !$0.isValid }
    }

    private func removeInvalidItems(_ record: ModeRecord) {
        removeInvalid(&record.timers)
        record.observers.removeAll { !$0.isValid }
        record.observersChanged()
    }

    /// Removes the custom sources invalidated since the last purge from all their modes at
    /// once, as `CFRunLoopSourceInvalidate` does, in their order: each source's own modes, not
    /// a scan of every mode's sources (a loop has one per port, and a one-shot timer's end
    /// purges too).
    private func removeInvalidatedSources() {
        let invalidated = takeInvalidatedSources()
        guard !invalidated.isEmpty else { return }
        removeEverywhere(invalidated)
        recycleInvalidatedSources(invalidated)
    }

    /// Takes `sources` out of every mode they are in, calling `cancel` for each mode, in their
    /// order (and, for one order, the order they were first added in). Loop-only.
    func removeEverywhere(_ sources: [PKCustomSource]) {
        var sources = sources
        if sources.count > 1 {
            sources.sort { ($0.order, $0.addedSequence) < ($1.order, $1.addedSequence) }
        }
        for source in sources {
            let key = ObjectIdentifier(source)
            commonItems.customSources[key] = nil
            let modes = source.modes
            source.modes = []
            for mode in modes where record(mode)?.customSources.removeValue(forKey: key) != nil {
                source.cancelled(on: self, mode: mode)
            }
        }
    }

    /// Removes the invalid timers of `timers` in place (nothing is copied when all are valid).
    private func removeInvalid(_ timers: inout [ObjectIdentifier: PKTimer]) {
        var gone: [ObjectIdentifier] = []
        for (key, timer) in timers where !timer.isValid { gone.append(key) }
        guard !gone.isEmpty else { return }
        for key in gone { timers[key] = nil }
        noteTimersChanged()
    }

    /// Whether `mode` has nothing that could end a wait: no sources and no timers.
    func isEmpty(_ mode: PKRunLoopMode) -> Bool { record(mode)?.isEmpty ?? true }
}
